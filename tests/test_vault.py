"""The vault's secrets against real gateways: versions, check-and-set, soft delete, undelete,
destroy across restarts; access and its audit; a record moved on the backend; rotation; values
kept out of logs, audit, errors, metrics and biographies; and bad input that changes nothing."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import UPSTREAM_BUCKET
from servers import Gateway

from gateway.admin_client import AdminClient, AdminError
from gateway.bio_client import BioClient
from gateway.secret_store.errors import SecretError
from gateway.secret_store.paths import data_prefix
from gateway.secret_store.service import Secrets
from gateway.store.base import INTERNAL_BUCKET
from gateway.store.local import LocalStore
from gateway.store.objects import read_object, write_object
from gateway.store.s3 import encode_key
from vault import IntegrityError
from vault import secrets as sealed
from vault.keys import StaticKeyProvider


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Vault:
    """Signed calls to /v1/vault on AdminClient's transport: (status, JSON) or (status, code)."""

    def __init__(self, gw: Gateway, access_key: str, secret_key: str) -> None:
        self.client = AdminClient(gw.endpoint, access_key, secret_key)

    def call(self, method: str, path: str, body=None, query=None, raw: bytes | None = None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        try:
            status, _, out = self.client._request(method, "/v1/vault/" + quote(path, safe="/%"),
                                                  query=query, body=data,
                                                  content_type="application/json" if data else None)
        except AdminError as exc:
            return exc.status, exc.code, exc.message
        return status, (json.loads(out) if out else None), None

    def put(self, path: str, value: str, **query):
        return self.call("PUT", "secrets/" + path, {"value": value}, {k: str(v) for k, v in query.items()})

    def get(self, path: str, version: int | None = None):
        return self.call("GET", "secrets/" + path, query={"version": str(version)} if version else None)

    def meta(self, path: str) -> dict:
        status, body, _ = self.call("GET", "metadata/" + path)
        assert status == 200, body
        return body


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("vault") / "data").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def root(gw):
    return Vault(gw, gw.access_key, gw.secret_key)


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


def new_agent(admin, gw) -> tuple[str, Vault, dict]:
    name = uid("ag")
    created = admin.create_agent(name)
    return name, Vault(gw, created["access_key"], created["secret_key"]), created


def every_audit_record(admin) -> list[dict]:
    records, cursor = [], None
    while True:
        page = admin.audit(limit=1000, after=cursor)
        records += page["records"]
        if len(page["records"]) < 1000:  # reading the audit is audited: stop at a short page
            return records
        cursor = page["cursor"]


# -- the lifecycle, across a restart ---------------------------------------------------------


def test_versions_cas_delete_undelete_destroy_survive_a_restart(tmp_path):
    gw = Gateway(tmp_path / "data").start()
    try:
        v = Vault(gw, gw.access_key, gw.secret_key)
        assert v.put("svc/db", "first-value-1", cas=0)[1]["version"] == 1
        assert v.put("svc/db", "second-value-2", cas=1)[1]["version"] == 2
        assert v.put("svc/db", "not-stored", cas=1)[:2] == (412, "CasMismatch")
        assert v.put("svc/db", "not-stored", cas=0)[:2] == (412, "CasMismatch")
        assert v.call("PUT", "secrets/svc/db", {"value_base64": base64.b64encode(b"\xff\x00bin").decode()})[0] == 200
        assert v.call("DELETE", "secrets/svc/db", query={"versions": "2"})[0] == 204
        assert v.call("POST", "destroy/svc/db", {"versions": [1]})[0] == 200
    finally:
        gw.stop()
    gw.start()
    try:
        v = Vault(gw, gw.access_key, gw.secret_key)
        status, body, _ = v.get("svc/db")
        assert status == 200 and body["encoding"] == "base64" and base64.b64decode(body["value"]) == b"\xff\x00bin"
        assert v.get("svc/db", 2)[:2] == (404, "NoSuchSecret")
        assert v.get("svc/db", 1)[:2] == (410, "SecretDestroyed")  # the root too: the key is gone
        assert v.get("svc/db", 9)[:2] == (404, "NoSuchSecret")
        assert v.call("POST", "undelete/svc/db", {"versions": [2]})[0] == 200
        assert v.get("svc/db", 2)[1]["value"] == "second-value-2"
        assert v.call("POST", "undelete/svc/db", {"versions": [1]})[:2] == (410, "SecretDestroyed")
        versions = {e["version"]: e for e in v.meta("svc/db")["versions"]}
        assert versions[1]["destroyed"] and not versions[2]["deleted_time"] and versions[3]["created_by"] == "root"
        # a soft-deleted latest version is not served in place of the latest
        assert v.call("DELETE", "secrets/svc/db")[0] == 204
        status, code, message = v.get("svc/db")
        assert (status, code) == (404, "NoSuchSecret") and "deleted" in message
        # destroying the whole path forgets it; numbering starts again
        assert v.call("DELETE", "metadata/svc/db")[0] == 204
        assert v.get("svc/db")[:2] == (404, "NoSuchSecret")
        assert v.put("svc/db", "again-value-1", cas=0)[1]["version"] == 1
    finally:
        gw.stop()


def test_old_versions_beyond_max_versions_are_destroyed(root):
    path = f"svc/{uid('rot')}"
    root.put(path, "value-number-1")
    assert root.call("PUT", "metadata/" + path, {"max_versions": 3, "metadata": {"owner": "ops"}})[0] == 200
    for n in range(2, 6):
        assert root.put(path, f"value-number-{n}")[1]["version"] == n
    meta = root.meta(path)
    assert [e["version"] for e in meta["versions"]] == [3, 4, 5]
    assert meta["metadata"] == {"owner": "ops"} and meta["max_versions"] == 3
    assert root.get(path, 1)[:2] == (404, "NoSuchSecret")
    assert root.get(path, 3)[1]["value"] == "value-number-3"
    root.call("PUT", "metadata/" + path, {"max_versions": 1})
    assert [e["version"] for e in root.meta(path)["versions"]] == [5]


def test_concurrent_check_and_set_has_one_winner_per_version(root):
    path = f"svc/{uid('race')}"
    root.put(path, "base-value-000")
    results: list = []

    def write(i: int) -> None:
        results.append(root.put(path, f"writer-value-{i:03d}", cas=1)[:2])
    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(s for s, _ in results) == [200] + [412] * 7
    assert root.meta(path)["current_version"] == 2
    # without cas, every writer gets its own version
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda i=i: statuses.append(root.put(path, f"free-value-{i:03d}")[0]))
               for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200] * 6
    assert [e["version"] for e in root.meta(path)["versions"]] == list(range(1, 9))


def test_listing_shows_metadata_never_values(root):
    base = uid("list")
    root.call("PUT", f"secrets/{base}/a", {"value": "list-value-aaaa", "metadata": {"team": "x"}})
    root.put(f"{base}/b", "list-value-bbbb")
    root.put(f"{base}/sub/c", "list-value-cccc")
    status, body, _ = root.call("GET", f"secrets/{base}/")
    assert status == 200
    assert [s["path"] for s in body["secrets"]] == [f"{base}/a", f"{base}/b"]
    assert body["folders"] == [f"{base}/sub/"] and body["secrets"][0]["metadata"] == {"team": "x"}
    assert "list-value" not in json.dumps(body)
    status, body, _ = root.call("GET", f"secrets/{base}/", query={"recursive": "true"})
    assert [s["path"] for s in body["secrets"]] == [f"{base}/a", f"{base}/b", f"{base}/sub/c"]
    assert "list-value" not in json.dumps(root.meta(f"{base}/a"))


# -- access and audit ---------------------------------------------------------------------------


def test_agents_read_their_own_secrets_only_and_denials_are_audited(gw, root, admin):
    name, agent, created = new_agent(admin, gw)
    other = uid("other")
    root.put(f"agents/{name}/token", "own-token-value-1")
    root.put(f"agents/{other}/token", "other-token-value-1")
    status, body, _ = agent.get(f"agents/{name}/token")
    assert status == 200 and body["value"] == "own-token-value-1"
    assert agent.call("GET", f"secrets/agents/{name}/")[0] == 200
    status, code, message = agent.get(f"agents/{other}/token")
    assert (status, code) == (403, "AccessDenied") and "vault:GetSecret" in message
    assert agent.put(f"agents/{name}/token", "agent-written-1")[:2] == (403, "AccessDenied")
    assert agent.call("POST", f"destroy/agents/{name}/token", {"versions": [1]})[:2] == (403, "AccessDenied")
    assert agent.call("GET", "secrets/agents/")[:2] == (403, "AccessDenied")
    # audited durably before the answer: the records are queryable at once
    records = admin.audit(principal=name, limit=100)["records"]
    denied = [r for r in records if r["decision"] == "deny" and r["action"] == "vault:GetSecret"]
    assert denied and denied[0]["resource"] == f"arn:orgmem:vault:::agents/{other}/token"
    read = [r for r in records if r["operation"] == "GetSecret" and r["status"] == 200]
    assert read and read[0]["version"] == 1 and read[0]["resource"].endswith(f"agents/{name}/token")
    assert "own-token-value-1" not in json.dumps(records)


def test_writes_are_audited_with_their_version(root, admin):
    path = f"svc/{uid('aud')}"
    root.put(path, "audited-value-1")
    root.put(path, "audited-value-2")
    records = [r for r in admin.audit(principal="root", limit=1000)["records"]
               if r["resource"] == f"arn:orgmem:vault:::{path}"]
    assert [(r["operation"], r["version"]) for r in records] == [("PutSecret", 1), ("PutSecret", 2)]


@pytest.mark.parametrize("versions", [["not-a-number"], [{"a": "b"}], [1.5], [True], [10**20]])
def test_versions_that_are_not_numbers_are_refused_and_audit_still_compacts(gw, root, admin, versions):
    """The refused request's audit record once kept the raw item as its int64 ``version``:
    compaction of the audit log then failed on every run, for every request since."""
    for op in ("undelete", "destroy"):
        status, code, _ = root.call("POST", f"{op}/svc/{uid('bad')}", {"versions": versions})
        assert (status, code) == (400, "InvalidRequest")
    BioClient(gw.endpoint, gw.access_key, gw.secret_key).compact()  # raised on a 500 before
    refused = [r for r in admin.audit(principal="root", limit=1000)["records"]
               if r["operation"] in ("UndeleteSecret", "DestroySecret") and r["status"] == 400]
    assert refused and all(r["version"] is None for r in refused)


def test_destroyed_and_pruned_versions_leave_no_record_behind(tmp_path):
    """Destroying means the sealed record (and its wrapped data key) is gone from the backend,
    not only marked so; an unlisted record of a writer still at work survives a destroy_all."""
    store = LocalStore(tmp_path / "store")
    store.create_bucket(INTERNAL_BUCKET)
    secrets = Secrets(store, StaticKeyProvider(b"k" * 32))

    def records(path: str) -> list[str]:
        return [e.key for e in store.list_objects(INTERNAL_BUCKET, data_prefix(path)).entries]
    for n in range(1, 4):
        secrets.put("app/x", f"value-number-{n}".encode(), "root")
    assert len(records("app/x")) == 3
    secrets.destroy("app/x", [1])
    assert len(records("app/x")) == 2 and all(".0000000001." not in k for k in records("app/x"))
    secrets.set_metadata("app/x", max_versions=1)
    assert len(records("app/x")) == 1
    in_flight = data_prefix("app/x") + "0000000004.feedbeef"
    write_object(store, INTERNAL_BUCKET, in_flight, b"a record a writer has just written")
    secrets.destroy_all("app/x")
    assert records("app/x") == [in_flight]
    with pytest.raises(SecretError) as gone:
        secrets.get("app/x")
    assert gone.value.code == "NoSuchSecret"
    assert secrets.put("app/x", b"a fresh start", "root", cas=0)["version"] == 1


def test_lowering_max_versions_needs_the_right_to_destroy(gw, root, admin):
    name, agent, created = new_agent(admin, gw)
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": [
        "vault:PutSecret", "vault:GetSecret", "vault:ListSecrets"], "Resource": f"arn:orgmem:vault:::agents/{name}/*"}]}
    admin.put_policy(f"writer-{name}", json.dumps(policy).encode())
    admin.attach_policy(f"writer-{name}", agent=name)
    path = f"agents/{name}/keys"
    for n in range(3):
        assert agent.put(path, f"agent-value-{n:03d}")[0] == 200
    status, code, _ = agent.call("PUT", "metadata/" + path, {"max_versions": 1})
    assert (status, code) == (403, "AccessDenied")
    assert agent.call("PUT", "metadata/" + path, {"metadata": {"owner": name}})[0] == 200
    assert len(root.meta(path)["versions"]) == 3


def test_a_listing_leaves_out_what_a_deny_takes_from_the_granted_prefix(gw, root, admin):
    name, agent, _ = new_agent(admin, gw)
    base = uid("shared")
    for path in ("app/db", "admin/break-glass", "admin/deeper/root-pw"):
        root.call("PUT", f"secrets/{base}/{path}", {"value": "v-" + path, "metadata": {"owner": "cfo"}})
    admin.put_policy(f"ops-{name}", json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["vault:GetSecret", "vault:ListSecrets"],
         "Resource": f"arn:orgmem:vault:::{base}/*"},
        {"Effect": "Deny", "Action": "vault:*", "Resource": f"arn:orgmem:vault:::{base}/admin/*"}]}).encode())
    admin.attach_policy(f"ops-{name}", agent=name)
    time.sleep(1.2)
    assert agent.call("GET", f"secrets/{base}/admin/")[0] == 403
    status, body, _ = agent.call("GET", f"secrets/{base}/", query={"recursive": "true"})
    assert status == 200 and [s["path"] for s in body["secrets"]] == [f"{base}/app/db"]
    status, body, _ = agent.call("GET", f"secrets/{base}/")
    assert status == 200 and body["folders"] == [f"{base}/app/"] and body["secrets"] == []
    assert "admin" not in json.dumps(body)
    # an Allow on exactly the prefix lists all of it: only a Deny takes entries away
    lister, lister_vault, _ = new_agent(admin, gw)
    admin.put_policy(f"lister-{lister}", json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "vault:ListSecrets", "Resource": f"arn:orgmem:vault:::{base}/"}]}).encode())
    admin.attach_policy(f"lister-{lister}", agent=lister)
    time.sleep(1.2)
    status, body, _ = lister_vault.call("GET", f"secrets/{base}/", query={"recursive": "true"})
    assert status == 200 and len(body["secrets"]) == 3


def test_a_listing_page_never_names_a_hidden_entry(tmp_path, monkeypatch):
    """Pages of 2: the cursor is the last entry shown, and a page of hidden entries alone
    is read through, so no cursor names what a Deny takes."""
    monkeypatch.setattr("gateway.secret_store.service.MAX_LIST", 2)
    store = LocalStore(tmp_path / "store")
    store.create_bucket(INTERNAL_BUCKET)
    secrets = Secrets(store, StaticKeyProvider(b"k" * 32))
    for path in ("s/a", "s/b", "s/hide-1", "s/hide-2", "s/hide-3", "s/z"):
        secrets.put(path, b"value-" + path.encode(), "root")
    hidden = lambda name: "hide" in name  # noqa: E731
    seen, cursors, after = [], [], ""
    while True:
        page = secrets.list("s/", recursive=True, after=after, hidden=hidden)
        seen += [r["path"] for r in page["secrets"]]
        if "next" not in page:
            break
        cursors.append(after := page["next"])
    assert seen == ["s/a", "s/b", "s/z"] and not any("hide" in c for c in cursors)
    assert [r["path"] for r in secrets.list("s/", recursive=True)["secrets"]] == ["s/a", "s/b"]


def test_vault_values_are_redacted_wherever_an_event_holds_them(gw, root, admin):
    name, _, created = new_agent(admin, gw)
    token = "FILEVAL-" + uuid.uuid4().hex
    password = "JSONPW-" + uuid.uuid4().hex
    root.put(f"agents/{name}/token", token + "\n")  # as `vault put --from-file` keeps a newline
    root.put(f"agents/{name}/db", json.dumps({"user": "app", "password": password}))
    bio = BioClient(gw.endpoint, created["access_key"], created["secret_key"])
    session = uid("s")
    bio.put_events([{"session": session, "kind": "artifact", "content": f"export TOKEN={token}",
                     "artifact_uri": f"https://example.com/file?token={token}", "tags": [token, "ok"],
                     "tool": f"curl-{password}", "data": {token: 1, "nested": {"k": [password]}}}])
    events = bio.events(agent=name, session=session)["events"]
    text = json.dumps(events)
    assert token not in text and password not in text
    assert events[0]["tags"][1] == "ok" and events[0]["redactions"] >= 6


# -- the envelope: a record moved on the backend ---------------------------------------------------


def test_a_record_moved_to_another_path_fails_to_open(tmp_path):
    """Without the store's own sealing, only the secret's envelope stands in the way."""
    store = LocalStore(tmp_path / "store")
    store.create_bucket(INTERNAL_BUCKET)
    secrets = Secrets(store, StaticKeyProvider(b"k" * 32))
    secrets.put("app/a", b"value-of-a-123", "root")
    secrets.put("app/b", b"value-of-b-456", "root")

    def record_key(path: str) -> str:
        return store.list_objects(INTERNAL_BUCKET, data_prefix(path)).entries[0].key
    moved = read_object(store, INTERNAL_BUCKET, record_key("app/a"))[0]
    write_object(store, INTERNAL_BUCKET, record_key("app/b"), moved)
    with pytest.raises(SecretError) as err:
        secrets.get("app/b")
    assert err.value.code == "SecretDamaged" and err.value.status == 500
    assert "app/a" in err.value.message and "value-of" not in err.value.message
    assert secrets.get("app/a")[0] == b"value-of-a-123"


def test_a_record_moved_on_the_upstream_bucket_fails_to_open(tmp_path, seaweed):
    prefix = uid("vault-move")
    gw = Gateway(tmp_path / "data", env=seaweed.env,
                 extra_args=["--backend", f"s3://{UPSTREAM_BUCKET}/{prefix}",
                             "--backend-endpoint", seaweed.endpoint]).start()
    try:
        v = Vault(gw, gw.access_key, gw.secret_key)
        v.put("app/a", "upstream-value-a")
        v.put("app/b", "upstream-value-b")
        raw = seaweed.client()

        def record_key(path: str) -> str:  # the upstream store's own encoding of the key
            where = f"{prefix}/{INTERNAL_BUCKET}/{encode_key(data_prefix(path) + 'x')[:-1]}"
            return raw.list_objects_v2(Bucket=UPSTREAM_BUCKET, Prefix=where)["Contents"][0]["Key"]
        raw.copy_object(Bucket=UPSTREAM_BUCKET, Key=record_key("app/b"),
                        CopySource={"Bucket": UPSTREAM_BUCKET, "Key": record_key("app/a")},
                        MetadataDirective="COPY")
        status, code, message = v.get("app/b")
        assert (status, code) == (500, "SecretDamaged") and "upstream-value" not in message
        assert v.get("app/a")[1]["value"] == "upstream-value-a"
    finally:
        gw.stop()


def test_the_envelope_binds_path_and_version():
    keys = StaticKeyProvider(b"s" * 32)
    record = sealed.seal(keys, "p/q", 3, b"bound-value")
    assert sealed.open_record(keys, sealed.SecretRecord.decode(record.encode()), "p/q", 3) == b"bound-value"
    for path, version in (("p/r", 3), ("p/q", 4)):
        with pytest.raises(IntegrityError):
            sealed.open_record(keys, record, path, version)
    flipped = bytearray(record.ciphertext)
    flipped[0] ^= 1
    tampered = sealed.SecretRecord(record.path, record.version, record.wrapped, record.nonce,
                                   bytes(flipped), record.size)
    with pytest.raises(IntegrityError):
        sealed.open_record(keys, tampered, "p/q", 3)
    with pytest.raises(IntegrityError):
        sealed.open_record(StaticKeyProvider(b"t" * 32), record, "p/q", 3)
    with pytest.raises(IntegrityError):
        sealed.SecretRecord.decode(b'{"format": 1, "path": "p/q"}')
    assert "bound-value" not in repr(record) and b"bound-value" not in record.encode()


# -- rotation ---------------------------------------------------------------------------------


def test_rotation_and_rewrap_cover_secrets(tmp_path):
    gw = Gateway(tmp_path / "data").start()
    try:
        v = Vault(gw, gw.access_key, gw.secret_key)
        for i in range(5):
            v.put(f"rot/s{i}", f"rotating-value-{i}")
        kek = v.client._call("GET", "vault", "kek")
        assert kek["secrets_by_version"] == {"1": 5}
        v.client._call("POST", "vault", "kek", "rotate")
        v.put("rot/s0", "rotating-value-new")  # sealed under the new primary at once
        assert v.client._call("GET", "vault", "kek")["secrets_by_version"] == {"1": 5, "2": 1}
        with pytest.raises(AdminError) as refused:
            v.client._call("POST", "vault", "kek", "retire", payload={"version": 1})
        assert refused.value.code == "DeleteConflict" and "secret" in refused.value.message
        while not v.client._call("POST", "vault", "rewrap", payload={"resume": True, "limit": 500})["done"]:
            pass
        assert v.client._call("GET", "vault", "kek")["secrets_by_version"] == {"2": 6}
        v.client._call("POST", "vault", "kek", "retire", payload={"version": 1})
        assert v.get("rot/s3")[1]["value"] == "rotating-value-3"
        assert v.get("rot/s0", 1)[1]["value"] == "rotating-value-0"
    finally:
        gw.stop()


# -- no secret anywhere but in a successful read --------------------------------------------------


def test_planted_values_appear_nowhere_but_in_reads(gw, root, admin):
    name, agent, created = new_agent(admin, gw)
    planted = {f"agents/{name}/api-key": "PLANTED-api-" + uuid.uuid4().hex,
               f"agents/{name}/db-password": "PLANTED-pw-" + uuid.uuid4().hex}
    for path, value in planted.items():
        assert root.put(path, value)[0] == 200
        assert agent.get(path)[1]["value"] == value
    path, value = next(iter(planted.items()))
    answers = [
        root.put(path, value, cas=99),                                       # CAS mismatch
        root.call("PUT", "secrets/" + path, {"value": value * 3000}),        # too large
        root.call("PUT", "secrets/" + path, {"value": value, "value_base64": value}),
        root.call("PUT", "secrets/" + path, {"value_base64": value + "!"}),
        root.call("PUT", "secrets/" + path, {"value": value, "bogus": value}),
        root.call("PUT", "secrets/" + path, {"value": value, "metadata": {"k": value * 100}}),
        root.call("PUT", "secrets/bad%20path/x", {"value": value}),
        root.call("PUT", "secrets/" + path, raw=b'{"value": "' + value.encode() + b'"'),
        agent.put(path, value),                                              # 403
    ]
    for status, code, message in answers:
        assert status >= 400 and value not in f"{code} {message}", (status, code)
    # a biography event quoting the values is redacted by value, whatever its shape
    bio = BioClient(gw.endpoint, created["access_key"], created["secret_key"])
    session = uid("s")
    bio.put_events([{"session": session, "kind": "tool_result",
                     "content": f"connected with {planted[path]} ok",
                     "data": {"env": {"X": list(planted.values())[1]}, "note": "no secret here"}}])
    events = json.dumps(bio.events(agent=name, session=session))
    assert "[REDACTED:vault:" in events and "PLANTED-" not in events
    metrics = admin._request("GET", "/metrics")[2].decode()
    audit = json.dumps(every_audit_record(admin))
    gw_log = Path(gw.log_path).read_text()
    for value in planted.values():
        for text in (metrics, audit, gw_log):
            assert value not in text


# -- bad input changes nothing -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["a/../b", "a//b", "a/./b", "..", "a/b/", "a b", "a/%00", "x" * 513,
                                  "/".join("s" * 17)])
def test_invalid_paths_are_refused(root, path):
    status, code, message = root.call("PUT", "secrets/" + path, {"value": "never-stored"})
    assert status in (400, 404) and code in ("InvalidPath", "NoSuchRoute"), (status, code, message)
    assert root.call("GET", "secrets/", query={"recursive": "true"})[0] == 200


@pytest.mark.parametrize("body,query,code,status", [
    ({"value": "x" * (64 * 1024 + 1)}, None, "ValueTooLarge", 413),
    ({"value": ""}, None, "InvalidRequest", 400),
    ({}, None, "InvalidRequest", 400),
    ({"value": 5}, None, "InvalidRequest", 400),
    ({"value_base64": "%%%"}, None, "InvalidRequest", 400),
    ({"value": "ok-value-1", "metadata": ["a"]}, None, "InvalidRequest", 400),
    ({"value": "ok-value-1", "metadata": {"k": 1}}, None, "InvalidRequest", 400),
    ({"value": "ok-value-1"}, {"cas": "-1"}, "InvalidRequest", 400),
    ({"value": "ok-value-1"}, {"cas": "abc"}, "InvalidRequest", 400),
    ({"value": "ok-value-1"}, {"cas": "7"}, "CasMismatch", 412),
    ([1, 2], None, "InvalidRequest", 400),
])
def test_bad_writes_answer_clearly_and_change_nothing(root, body, query, code, status):
    path = f"bad/{uid('w')}"
    root.put(path, "the-original-value")
    before = root.meta(path)
    got = root.call("PUT", "secrets/" + path, body, query)
    assert got[:2] == (status, code), got
    assert got[2] and len(got[2]) < 300
    assert root.meta(path) == before
    assert root.get(path)[1]["value"] == "the-original-value"


@pytest.mark.parametrize("method,route,body,query", [
    ("POST", "undelete/", {"versions": []}, None),
    ("POST", "undelete/", {"versions": ["1"]}, None),
    ("POST", "destroy/", {"versions": [0]}, None),
    ("POST", "destroy/", {"version": 1}, None),
    ("POST", "destroy/", {"versions": [7]}, None),
    ("DELETE", "secrets/", None, {"versions": "1,x"}),
    ("GET", "secrets/", None, {"version": "0"}),
    ("PUT", "metadata/", {"max_versions": 0}, None),
    ("PUT", "metadata/", {"max_versions": 101}, None),
    ("PUT", "metadata/", {"color": "red"}, None),
    ("GET", "secrets/", None, {"recursive": "maybe"}),
])
def test_bad_version_and_metadata_requests_change_nothing(root, method, route, body, query):
    path = f"bad/{uid('v')}"
    root.put(path, "kept-value-123")
    before = root.meta(path)
    target = route + (path + "/" if route == "secrets/" and query and "recursive" in query else path)
    status, code, message = root.call(method, target, body, query)
    assert status in (400, 404) and code in ("InvalidRequest", "NoSuchSecret"), (status, code, message)
    assert root.meta(path) == before


def test_missing_secrets_answer_404(root):
    path = f"none/{uid('x')}"
    assert root.get(path)[:2] == (404, "NoSuchSecret")
    assert root.call("GET", "metadata/" + path)[:2] == (404, "NoSuchSecret")
    assert root.call("DELETE", "secrets/" + path)[:2] == (404, "NoSuchSecret")
    assert root.call("DELETE", "metadata/" + path)[:2] == (404, "NoSuchSecret")
    assert root.call("GET", f"secrets/{path}/")[1] == {"prefix": f"{path}/", "secrets": [], "folders": []}


def test_another_gateways_secret_is_redacted_here_within_seconds(tmp_path, seaweed):
    """Gateways sharing a bucket learn each other's values: an event quoting a secret written
    through the other gateway is redacted once this one's refresh has run (every 5 s)."""
    prefix = uid("vault-pair")
    args = ["--backend", f"s3://{UPSTREAM_BUCKET}/{prefix}", "--backend-endpoint", seaweed.endpoint]
    one = Gateway(tmp_path / "one", extra_args=args, env=seaweed.env).start()
    two = None
    try:
        kek = ["--kek", f"file:{tmp_path / 'one.keyring.json'}"]
        two = Gateway(tmp_path / "two", extra_args=args + kek, env=seaweed.env).start()
        value = "PAIRED-" + uuid.uuid4().hex
        assert Vault(one, one.access_key, one.secret_key).put("shared/token", value)[0] == 200
        bio = BioClient(two.endpoint, two.access_key, two.secret_key)
        session = uid("s")
        deadline = time.monotonic() + 30
        while True:
            bio.put_events([{"agent": "pair", "session": session, "kind": "note", "content": f"used {value}"}])
            latest = bio.events(agent="pair", session=session)["events"][-1]["content"]
            if value not in latest:
                assert "[REDACTED:vault:" in latest
                break
            assert time.monotonic() < deadline, "the second gateway never learned the value"
            time.sleep(0.5)
        # and a destroyed secret stops being one
        Vault(one, one.access_key, one.secret_key).call("DELETE", "metadata/shared/token")
        deadline = time.monotonic() + 30
        while True:
            bio.put_events([{"agent": "pair", "session": session, "kind": "note", "content": f"used {value}"}])
            if value in bio.events(agent="pair", session=session)["events"][-1]["content"]:
                break
            assert time.monotonic() < deadline, "the second gateway kept redacting a destroyed value"
            time.sleep(0.5)
    finally:
        one.stop()
        if two is not None:
            two.stop()
