"""Skills against a real gateway: push/pull round trips, concurrent pushes, S3 reads, permissions, bad input."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
import threading
import uuid
from pathlib import Path
from urllib.parse import quote

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from click.testing import CliRunner
from servers import Gateway

from gateway.admin_client import AdminClient, AdminError
from gateway.cli import main
from gateway.memory import skill_format as fmt
from gateway.skills_client import SkillsClient, read_folder


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("skills") / "data").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


@pytest.fixture(scope="module")
def root(gw):
    return SkillsClient(gw.endpoint, gw.access_key, gw.secret_key)


def s3_client(gw, access_key, secret_key):
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=access_key,
                        aws_secret_access_key=secret_key, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def skill_name() -> str:
    return f"sk-{uuid.uuid4().hex[:8]}"


def make_skill(root: Path, name: str, description: str = "Reconcile vendor invoices.",
               extra: dict[str, bytes] | None = None, front: str | None = None) -> Path:
    folder = root / name
    (folder / "scripts").mkdir(parents=True)
    (folder / "assets").mkdir()
    (folder / "references").mkdir()
    front = front if front is not None else f"name: {name}\ndescription: {description}\nlicense: MIT\n"
    (folder / "SKILL.md").write_text(f"---\n{front}---\n\n# {name}\n\nRun scripts/run.sh.\n")
    run = folder / "scripts" / "run.sh"
    run.write_text("#!/bin/sh\necho ok\n")
    run.chmod(0o755)
    (folder / "assets" / "blob.bin").write_bytes(os.urandom(300_000))
    (folder / "references" / "REFERENCE.md").write_text("# Reference\n" + "x" * 1000)
    for rel, data in (extra or {}).items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def stored_skill_keys(gw, name: str) -> list[str]:
    """Every object the gateway holds for skill ``name``, straight from the local store's index."""
    con = sqlite3.connect(f"file:{gw.data / 'store' / 'index.db'}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT CAST(key AS TEXT) FROM objects WHERE bucket=? AND CAST(key AS TEXT) LIKE ?",
                           (".orgmem", f"skills/%/{name}/%")).fetchall()
    finally:
        con.close()
    return [r[0].decode() if isinstance(r[0], bytes) else r[0] for r in rows]


# -- round trip ----------------------------------------------------------------------------


def test_push_pull_round_trip_byte_for_byte(gw, root, tmp_path):
    name = skill_name()
    folder = make_skill(tmp_path, name, extra={"assets/nested/deep.dat": os.urandom(70_000)})
    manifest = root.push(folder, scope="org")
    assert manifest["version"] == 1 and manifest["scope"] == "org" and manifest["author"] == "root"
    assert {f["path"] for f in manifest["files"]} == set(tree(folder))
    assert manifest["front_matter"] == {"name": name, "description": "Reconcile vendor invoices.",
                                        "license": "MIT"}
    restored = tmp_path / "restored" / name
    pulled = root.pull(name, restored, scope="org")
    assert pulled["version"] == 1
    assert tree(restored) == tree(folder)
    assert os.access(restored / "scripts" / "run.sh", os.X_OK)
    assert not os.access(restored / "SKILL.md", os.X_OK)

    # a second version; pulling version 1 still gives the first bytes
    (folder / "assets" / "blob.bin").write_bytes(os.urandom(1000))
    assert root.push(folder, scope="org")["version"] == 2
    old = tmp_path / "old"
    root.pull(name, old, scope="org", version=1)
    assert tree(old) == tree(restored)
    assert root.manifest(name, scope="org")["version"] == 2
    assert [v["version"] for v in root.versions(name, scope="org")["versions"]] == [1, 2]


def test_cli_push_pull(gw, tmp_path):
    name = skill_name()
    folder = make_skill(tmp_path, name)
    env = {"ORGMEM_ENDPOINT": gw.endpoint, "ORGMEM_ROOT_ACCESS_KEY": gw.access_key,
           "ORGMEM_ROOT_SECRET_KEY": gw.secret_key, "ORGMEM_ACCESS_KEY": "", "ORGMEM_SECRET_KEY": ""}
    runner = CliRunner()
    out = runner.invoke(main, ["skills", "push", str(folder), "--scope", "org"], env=env)
    assert out.exit_code == 0, out.output
    assert f"published org/{name} version 1" in out.output
    out = runner.invoke(main, ["skills", "pull", name, str(tmp_path / "back"), "--version", "1"], env=env)
    assert out.exit_code == 0, out.output
    assert tree(tmp_path / "back") == tree(folder)
    out = runner.invoke(main, ["skills", "list", "--json", "-q", name], env=env)
    assert out.exit_code == 0, out.output
    assert [r["name"] for r in json.loads(out.output)] == [name]
    bad = tmp_path / "bad-cli"
    bad.mkdir()
    out = runner.invoke(main, ["skills", "push", str(bad)], env=env)
    assert out.exit_code == 1 and "SKILL.md" in out.output


def test_concurrent_pushes_give_two_whole_versions(gw, root, tmp_path):
    name = skill_name()
    folders = [make_skill(tmp_path / str(i), name, description=f"Variant {i}.") for i in range(2)]
    payloads = [read_folder(f)[1] for f in folders]
    results: list = [None, None]
    barrier = threading.Barrier(2)

    def push(i: int) -> None:
        client = SkillsClient(gw.endpoint, gw.access_key, gw.secret_key)
        barrier.wait()
        results[i] = client.publish(name, payloads[i], scope="org")

    threads = [threading.Thread(target=push, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r["version"] for r in results) == [1, 2]
    for version in (1, 2):
        out = tmp_path / f"v{version}"
        manifest = root.pull(name, out, scope="org", version=version)
        which = int(manifest["description"].split()[1].rstrip("."))
        assert tree(out) == tree(folders[which])  # whole: every file from the same push
    assert {r["description"] for r in results} == {"Variant 0.", "Variant 1."}


# -- S3 --------------------------------------------------------------------------------


def test_read_through_s3(gw, root, tmp_path):
    name = skill_name()
    folder = make_skill(tmp_path, name)
    root.push(folder, scope="org")
    s3 = s3_client(gw, gw.access_key, gw.secret_key)
    listed = s3.list_objects_v2(Bucket="skills", Prefix=f"org/{name}/")
    files = tree(folder)
    assert {o["Key"] for o in listed["Contents"]} == {f"org/{name}/{p}" for p in files}
    for obj in listed["Contents"]:
        path = obj["Key"].split("/", 2)[2]
        assert obj["Size"] == len(files[path])
        assert obj["ETag"].strip('"') == hashlib.md5(files[path]).hexdigest()
        got = s3.get_object(Bucket="skills", Key=obj["Key"])
        assert got["Body"].read() == files[path]
    ranged = s3.get_object(Bucket="skills", Key=f"org/{name}/assets/blob.bin", Range="bytes=10-99")
    assert ranged["Body"].read() == files["assets/blob.bin"][10:100]
    top = s3.list_objects_v2(Bucket="skills", Prefix="org/", Delimiter="/")
    assert f"org/{name}/" in [p["Prefix"] for p in top.get("CommonPrefixes", [])]
    # a new version replaces what the bucket shows
    (folder / "references" / "REFERENCE.md").write_text("new")
    root.push(folder, scope="org")
    got = s3.get_object(Bucket="skills", Key=f"org/{name}/references/REFERENCE.md")
    assert got["Body"].read() == b"new"
    # read-only
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket="skills", Key=f"org/{name}/SKILL.md", Body=b"x")
    assert err.value.response["Error"]["Code"] == "MethodNotAllowed"
    assert "orgmem skills push" in err.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as err:
        s3.delete_object(Bucket="skills", Key=f"org/{name}/SKILL.md")
    with pytest.raises(ClientError) as err:
        s3.create_bucket(Bucket="skills")
    assert err.value.response["Error"]["Code"] == "InvalidBucketName"
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="skills", Key=f"org/{name}/missing.txt")
    assert err.value.response["Error"]["Code"] == "NoSuchKey"


# -- permissions ---------------------------------------------------------------------------


def test_listing_and_reads_follow_permissions(gw, admin, root, tmp_path):
    tag = uuid.uuid4().hex[:6]
    mine, other = f"fin-{tag}", f"ops-{tag}"
    admin.create_team(mine)
    admin.create_team(other)
    agent = f"ag-{tag}"
    creds = admin.create_agent(agent, teams=[mine], policies=["agent-default"])
    client = SkillsClient(gw.endpoint, creds["access_key"], creds["secret_key"])
    names = {s: f"{s}-{tag}" for s in ("orgsk", "teamsk", "othersk", "ownsk")}
    root.push(make_skill(tmp_path, names["orgsk"], description=f"Org wide {tag}."), scope="org")
    root.push(make_skill(tmp_path, names["teamsk"], description=f"Team {tag}."), scope=f"team:{mine}")
    root.push(make_skill(tmp_path, names["othersk"], description=f"Other {tag}."), scope=f"team:{other}")
    # the agent publishes into its own scope by default, and nowhere else
    own = client.push(make_skill(tmp_path, names["ownsk"], description=f"Own {tag}."))
    assert own["scope"] == f"agent:{agent}" and own["author"] == agent
    with pytest.raises(AdminError) as err:
        client.push(tmp_path / names["ownsk"], scope="org")
    assert err.value.status == 403

    rows = client.list(q=tag)
    assert {(r["scope"], r["name"]) for r in rows} == {
        ("org", names["orgsk"]), (f"team:{mine}", names["teamsk"]), (f"agent:{agent}", names["ownsk"])}
    for row in rows:
        assert set(row) >= {"name", "description", "version", "author"}
    assert {r["name"] for r in root.list(q=tag)} == set(names.values())
    with pytest.raises(AdminError) as err:
        client.list(scope=f"team:{other}")
    assert err.value.status == 403
    with pytest.raises(AdminError) as err:
        client.manifest(names["othersk"], scope=f"team:{other}")
    assert err.value.status == 403
    with pytest.raises(AdminError) as err:  # not found among the scopes it may read
        client.manifest(names["othersk"])
    assert err.value.status == 404
    assert client.manifest(names["teamsk"])["scope"] == f"team:{mine}"
    assert client.list(q=f"team {tag}")[0]["name"] == names["teamsk"]

    s3 = s3_client(gw, creds["access_key"], creds["secret_key"])
    keys = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="skills"):
        keys.update(o["Key"] for o in page.get("Contents", []))
    assert f"org/{names['orgsk']}/SKILL.md" in keys
    assert f"teams/{mine}/{names['teamsk']}/SKILL.md" in keys
    assert f"agents/{agent}/{names['ownsk']}/SKILL.md" in keys
    assert not any(names["othersk"] in k for k in keys)
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="skills", Key=f"teams/{other}/{names['othersk']}/SKILL.md")
    assert err.value.response["Error"]["Code"] == "AccessDenied"


# -- bad input -----------------------------------------------------------------------------


def _files(name: str, skill_md: str | bytes, **extra: bytes) -> list[dict]:
    data = skill_md.encode() if isinstance(skill_md, str) else skill_md
    files = {"SKILL.md": data, **{k.replace("__", "/"): v for k, v in extra.items()}}
    return [{"path": p, "content": base64.b64encode(d).decode()} for p, d in files.items()]


def _refused(gw, root, name: str, files: list[dict] | None = None, body: bytes | None = None,
             status: int = 400) -> str:
    with pytest.raises(AdminError) as err:
        if body is not None:
            root._raw("POST", f"/v1/skills/{name}/versions", {"scope": "org"}, body)
        else:
            root.publish(name, files, scope="org")
    assert err.value.status == status, err.value
    with pytest.raises(AdminError) as missing:
        root.manifest(name, scope="org")
    assert missing.value.status in (400, 404)  # an invalid name cannot even be asked for
    assert stored_skill_keys(gw, name) == []
    return err.value.message


def test_bad_skills_are_refused_and_nothing_is_stored(gw, root):
    n = skill_name()
    good = f"---\nname: {n}\ndescription: Fine.\n---\nbody\n"
    assert "YAML" in _refused(gw, root, n, _files(n, f"---\nname: {n}\ndescription: [unclosed\n---\n"))
    assert "front matter" in _refused(gw, root, n, _files(n, "# no front matter\n"))
    assert "'description'" in _refused(gw, root, n, _files(n, f"---\nname: {n}\n---\n"))
    assert "'name'" in _refused(gw, root, n, _files(n, "---\ndescription: x\n---\n"))
    assert "unknown front matter field 'version'" in _refused(
        gw, root, n, _files(n, f"---\nname: {n}\ndescription: x\nversion: 2\n---\n"))
    assert "must equal the skill's folder name" in _refused(
        gw, root, n, _files(n, "---\nname: other-name\ndescription: x\n---\n"))
    long_name = "a" * 65
    assert "64" in _refused(gw, root, long_name, _files(long_name, f"---\nname: {long_name}\n"
                                                                    "description: x\n---\n"))
    assert "1024" in _refused(gw, root, n, _files(n, f"---\nname: {n}\ndescription: {'d' * 1025}\n---\n"))
    assert "Upper" in _refused(gw, root, n, _files(n, "---\nname: Upper\ndescription: x\n---\n"))
    assert "not valid Unicode" in _refused(gw, root, n, _files(n, f'---\nname: {n}\ndescription: "x\\ud800"\n---\n'))
    newline = quote(f"{n}\n", safe="")
    with pytest.raises(AdminError) as err:  # a name may not end in a newline ($ allowed one)
        root._raw("POST", f"/v1/skills/{newline}/versions", {"scope": "org"},
                  json.dumps({"files": _files(n, good)}).encode())
    assert err.value.status == 400
    no_skill_md = [{"path": "scripts/run.sh", "content": base64.b64encode(b"echo").decode()}]
    assert "needs SKILL.md" in _refused(gw, root, n, no_skill_md)
    for bad_path in ("../evil.sh", "scripts/../../evil.sh", "/etc/passwd", "scripts\\x.sh", "a//b"):
        files = _files(n, good) + [{"path": bad_path, "content": ""}]
        assert "path" in _refused(gw, root, n, files)
    assert "base64" in _refused(gw, root, n, _files(n, good) + [{"path": "x", "content": "!!"}])
    assert "not valid JSON" in _refused(gw, root, n, body=b"{not json")
    # a 10 MB body: refused before it is read whole
    big = _files(n, good) + [{"path": "assets/big.bin",
                              "content": base64.b64encode(os.urandom(10 * 1024 * 1024)).decode()}]
    _refused(gw, root, n, body=json.dumps({"files": big}).encode(), status=413)
    # 8 MiB of files just under the body limit are refused by size too
    over = _files(n, good) + [{"path": "assets/big.bin",
                               "content": base64.b64encode(b"\0" * (fmt.MAX_TOTAL_BYTES + 1)).decode()}]
    assert "bytes together" in _refused(gw, root, n, over)
    # and the same skill, well-formed, is accepted
    assert root.publish(n, _files(n, good), scope="org")["version"] == 1
    assert len(stored_skill_keys(gw, n)) == 2  # the blob and the manifest: the check above sees them


def test_local_validation_matches(tmp_path):
    folder = tmp_path / "my-skill"
    folder.mkdir()
    with pytest.raises(AdminError, match="SKILL.md"):
        read_folder(folder)
    (folder / "SKILL.md").write_text("---\nname: my-skill\ndescription: ok\n---\n")
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref")
    name, files = read_folder(folder)
    assert name == "my-skill" and [f["path"] for f in files] == ["SKILL.md"]


# -- review fixes -------------------------------------------------------------------------------


def test_odd_version_numbers_are_400(root):
    with pytest.raises(AdminError) as err:
        root._raw("GET", "/v1/skills/some-skill", {"scope": "org", "version": "\u00b2"})
    assert err.value.status == 400 and "version" in err.value.message


def test_a_symlink_out_of_the_folder_is_not_pushed(tmp_path):
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = not-for-the-fleet\n")
    folder = tmp_path / "linky"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: linky\ndescription: ok\n---\n")
    (folder / "notes.md").write_text("inside")
    (folder / "alias.md").symlink_to(folder / "notes.md")  # a link inside the folder is fine
    assert [f["path"] for f in read_folder(folder)[1]] == ["SKILL.md", "alias.md", "notes.md"]
    (folder / "assets").mkdir()
    (folder / "assets" / "key").symlink_to(secret)
    with pytest.raises(AdminError, match="outside the skill folder"):
        read_folder(folder)


def test_two_pushes_taking_the_same_number_give_two_whole_versions(tmp_path):
    """Deterministic race: both pushes read the same latest version (a barrier holds them
    there) and race for one manifest; the loser takes the next number, nothing mixes."""
    from gateway.log import DurableLog
    from gateway.memory.skills import FileIn, Scope, Skills
    from gateway.store.base import INTERNAL_BUCKET
    from gateway.store.local import LocalStore

    store = LocalStore(tmp_path / "store")
    store.create_bucket(INTERNAL_BUCKET)
    log = DurableLog(store, flush_interval=0.05).start()
    barrier = threading.Barrier(2, timeout=10)
    first_read = threading.local()

    class Racing(Skills):
        def latest_version(self, scope, name):
            found = super().latest_version(scope, name)
            if not getattr(first_read, "done", False):
                first_read.done = True
                barrier.wait()
            return found

    skills = Racing(store, log)
    name = "racing-skill"
    pushes = [[FileIn("SKILL.md", f"---\nname: {name}\ndescription: Variant {i}.\n---\n".encode()),
               FileIn(f"assets/only-{i}.bin", os.urandom(1000 + i))] for i in range(2)]
    results: list = [None, None]

    def push(i: int) -> None:
        results[i] = skills.publish(Scope("org"), name, pushes[i], f"pusher-{i}")

    threads = [threading.Thread(target=push, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    assert sorted(r["version"] for r in results) == [1, 2]
    for i, manifest in enumerate(results):
        stored = skills.manifest(Scope("org"), name, manifest["version"])
        assert stored["author"] == f"pusher-{i}"
        assert {f["path"] for f in stored["files"]} == {"SKILL.md", f"assets/only-{i}.bin"}
        for f in pushes[i]:
            assert skills.read_file(stored, f.path)[1] == f.data


def test_a_dangling_link_in_a_skill_folder_is_a_clear_error(tmp_path):
    from gateway.skills_client import SkillsError, read_folder

    folder = tmp_path / "tidy-notes"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: tidy-notes\ndescription: Keeps notes tidy.\n---\nSteps.\n")
    (folder / "assets").mkdir()
    (folder / "assets" / "gone").symlink_to(folder / "assets" / "nowhere")
    with pytest.raises(SkillsError, match="cannot read assets/gone"):
        read_folder(folder)
