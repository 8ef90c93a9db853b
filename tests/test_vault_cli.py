"""`orgmem vault` (secrets) and `orgmem run`, run as subprocesses against a real gateway.

Secrets are written as root and read by an agent created through the admin API, which by
default may read only agents/<its name>/*. Every CLI call is checked for the values planted in
this module: none may ever show up on stderr, and listings never print them at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from clients import clean_env
from servers import BIN, Gateway, free_port

from gateway.admin_client import AdminClient
from vault.keys import FileKeyring

ORGMEM = BIN / "orgmem"
#: Every secret value a test planted: none may appear in any CLI's stderr.
PLANTED: set[str] = set()


def planted(label: str = "v") -> str:
    value = f"planted-{label}-{uuid.uuid4().hex}"
    PLANTED.add(value)
    return value


def uid(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(tmp_path_factory.mktemp("vault-cli") / "data").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw):
    return AdminClient(gw.endpoint, gw.access_key, gw.secret_key)


@pytest.fixture(scope="module")
def agent(admin):
    """An agent with the default policy: it may read agents/<name>/* and nothing else."""
    return admin.create_agent(uid("ag"))


def env_for(gw: Gateway, creds: dict | None = None, **extra: str) -> dict[str, str]:
    """A clean environment pointing at ``gw``: root keys, or ``creds``'s keys as ORGMEM_*."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("ORGMEM_")}
    env["ORGMEM_ENDPOINT"] = gw.endpoint
    if creds is None:
        env.update(ORGMEM_ROOT_ACCESS_KEY=gw.access_key, ORGMEM_ROOT_SECRET_KEY=gw.secret_key)
    else:
        env.update(ORGMEM_ACCESS_KEY=creds["access_key"], ORGMEM_SECRET_KEY=creds["secret_key"])
    env.update(extra)
    return env


def orgmem(gw: Gateway, *args: str, input: bytes = b"", expect: int | None = 0, creds: dict | None = None,
           env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `orgmem ARGS` with bytes in and out; check the exit code, and that neither a planted
    value nor the caller's secret key reaches stderr."""
    env = env_for(gw, creds) if env is None else env
    proc = subprocess.run([str(ORGMEM), *args], env=env, input=input, capture_output=True, timeout=60,
                          cwd=cwd, check=False)
    err = proc.stderr.decode("utf-8", "replace")
    if expect is not None:
        assert proc.returncode == expect, (f"orgmem {' '.join(args)} exited {proc.returncode}, expected "
                                           f"{expect}\nstdout:\n{proc.stdout!r}\nstderr:\n{err}")
    for value in PLANTED:
        assert value not in err, f"a secret value leaked to stderr of orgmem {' '.join(args)}"
    assert gw.secret_key not in err + proc.stdout.decode("utf-8", "replace")
    return proc


def vault(gw: Gateway, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return orgmem(gw, "vault", *args, **kwargs)


def stdout(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.decode("utf-8")


def stderr(proc: subprocess.CompletedProcess) -> str:
    return proc.stderr.decode("utf-8", "replace")


def as_json(gw: Gateway, *args: str, **kwargs):
    return json.loads(stdout(vault(gw, *args, "--json", **kwargs)))


def put(gw: Gateway, path: str, value: str | bytes, *args: str) -> None:
    data = value.encode() if isinstance(value, str) else value
    vault(gw, "put", path, *args, input=data)


# ============================================================================ put and get

def test_put_from_stdin_strips_exactly_one_newline(gw):
    path = f"team/{uid()}/api-key"
    value = planted()
    proc = vault(gw, "put", path, input=(value + "\n").encode())
    assert stdout(proc).strip() == f"{path}: version 1"
    assert stdout(vault(gw, "get", path)) == value  # a pipe: no newline added

    vault(gw, "put", path, input=(value + "\r\n").encode())
    assert stdout(vault(gw, "get", path, "--version", "2")) == value

    vault(gw, "put", path, input=(value + "\n\n").encode())  # only one newline goes
    assert stdout(vault(gw, "get", path)) == value + "\n"

    answer = as_json(gw, "get", path, "--version", "1")
    assert answer["version"] == 1 and answer["encoding"] == "text" and answer["value"] == value
    assert answer["created_by"]


def test_put_from_file_keeps_exact_bytes_and_binary(gw, tmp_path):
    text_path, bin_path = f"team/{uid()}/cert", f"team/{uid()}/blob"
    pem = f"-----BEGIN-----\n{planted()}\n-----END-----\n"
    (tmp_path / "cert.pem").write_text(pem)
    put_answer = as_json(gw, "put", text_path, "--from-file", str(tmp_path / "cert.pem"))
    assert put_answer["version"] == 1 and put_answer["path"] == text_path
    assert stdout(vault(gw, "get", text_path)) == pem  # the trailing newline is kept

    blob = b"\xff\x00\x01binary\xfe\n"
    (tmp_path / "blob.bin").write_bytes(blob)
    vault(gw, "put", bin_path, "--from-file", str(tmp_path / "blob.bin"))
    assert vault(gw, "get", bin_path).stdout == blob
    answer = as_json(gw, "get", bin_path)
    assert answer["encoding"] == "base64"


def test_put_metadata_and_cas(gw):
    path = f"team/{uid()}/token"
    vault(gw, "put", path, "--cas", "0", "--meta", "owner=research", "--meta", "rotate=monthly",
          input=planted().encode())
    assert as_json(gw, "get", path)["metadata"] == {"owner": "research", "rotate": "monthly"}
    proc = vault(gw, "put", path, "--cas", "0", input=planted().encode(), expect=1)
    assert "error: CasMismatch:" in stderr(proc)
    vault(gw, "put", path, "--cas", "1", input=planted().encode())
    assert as_json(gw, "get", path)["version"] == 2


def test_get_field_of_a_json_value(gw):
    path = f"team/{uid()}/db"
    password = planted("pw")
    put(gw, path, json.dumps({"user": "app", "password": password, "port": 5432, "opts": {"ssl": True}}))
    assert stdout(vault(gw, "get", path, "--field", "password")) == password
    assert stdout(vault(gw, "get", path, "--field", "port")) == "5432"
    assert json.loads(stdout(vault(gw, "get", path, "--field", "opts"))) == {"ssl": True}

    proc = vault(gw, "get", path, "--field", "nope", expect=1)
    assert "error: NoSuchField:" in stderr(proc) and "'nope'" in stderr(proc)
    assert "user" not in stderr(proc)  # not even the value's keys are shown

    plain = f"team/{uid()}/plain"
    put(gw, plain, planted())
    proc = vault(gw, "get", plain, "--field", "password", expect=1)
    assert "error: NotAJSONObject:" in stderr(proc) and "not JSON" in stderr(proc)
    listed = f"team/{uid()}/list"
    put(gw, listed, json.dumps([planted()]))
    assert "not an object" in stderr(vault(gw, "get", listed, "--field", "0", expect=1))
    assert "cannot be combined" in stderr(vault(gw, "get", path, "--field", "user", "--json", expect=2))


# ============================================================================ versions, rm, undelete, destroy

def test_versions_rm_and_undelete(gw):
    path = f"team/{uid()}/rotating"
    values = [planted(f"r{i}") for i in range(3)]
    for value in values:
        put(gw, path, value)

    assert "deleted the latest version" in stdout(vault(gw, "rm", path))
    proc = vault(gw, "get", path, expect=1)
    assert "error: NoSuchSecret:" in stderr(proc) and "deleted" in stderr(proc)
    assert stdout(vault(gw, "get", path, "--version", "2")) == values[1]

    table = stdout(vault(gw, "versions", path))
    assert "version" in table and "destroyed" in table and "current version 3" in table
    meta = as_json(gw, "versions", path)
    assert [v["version"] for v in meta["versions"]] == [1, 2, 3]
    assert meta["versions"][2]["deleted_time"] and not meta["versions"][1]["deleted_time"]

    assert "restored version 3" in stdout(vault(gw, "undelete", path, "--version", "3"))
    assert stdout(vault(gw, "get", path)) == values[2]

    vault(gw, "rm", path, "--version", "1", "--version", "2")
    meta = as_json(gw, "versions", path)
    assert [bool(v["deleted_time"]) for v in meta["versions"]] == [True, True, False]
    assert "Missing option '--version'" in stderr(vault(gw, "undelete", path, expect=2))


def test_destroy_asks_and_is_final(gw):
    path = f"team/{uid()}/doomed"
    first, second = planted("d1"), planted("d2")
    put(gw, path, first)
    put(gw, path, second)

    proc = vault(gw, "destroy", path, "--version", "1", input=b"n\n", expect=1)
    assert "cannot be undone" in stderr(proc)
    vault(gw, "destroy", path, "--version", "1", expect=1)  # no answer on stdin: nothing happens
    assert stdout(vault(gw, "get", path, "--version", "1")) == first

    assert "destroyed version 1" in stdout(vault(gw, "destroy", path, "--version", "1", input=b"y\n"))
    proc = vault(gw, "get", path, "--version", "1", expect=1)
    assert "error: SecretDestroyed:" in stderr(proc)
    assert as_json(gw, "versions", path)["versions"][0]["destroyed"] is True
    assert "SecretDestroyed" in stderr(vault(gw, "undelete", path, "--version", "1", expect=1))

    assert "not both and not neither" in stderr(vault(gw, "destroy", path, "--yes", expect=2))
    assert "not both" in stderr(vault(gw, "destroy", path, "--all", "--version", "2", "--yes", expect=2))
    vault(gw, "destroy", path, "--all", expect=1)  # unconfirmed
    assert stdout(vault(gw, "get", path)) == second
    vault(gw, "destroy", path, "--all", "--yes")
    assert "error: NoSuchSecret:" in stderr(vault(gw, "get", path, expect=1))
    assert "error: NoSuchSecret:" in stderr(vault(gw, "versions", path, expect=1))


# ============================================================================ list and metadata

def test_list_shows_paths_never_values(gw):
    top = uid("lst")
    values = {f"{top}/a": planted("la"), f"{top}/b": planted("lb"), f"{top}/sub/c": planted("lc")}
    for path, value in values.items():
        put(gw, path, value)
    vault(gw, "rm", f"{top}/b")

    out = stdout(vault(gw, "list", top))
    assert f"{top}/a" in out and f"{top}/b" in out and f"{top}/sub/" in out
    assert f"{top}/sub/c" not in out
    for column in ("path", "version", "updated", "deleted"):
        assert column in out
    row_b = next(line for line in out.splitlines() if f"{top}/b " in line)
    assert "yes" in row_b

    recursive = stdout(vault(gw, "list", f"{top}/", "--recursive"))
    assert f"{top}/sub/c" in recursive and f"{top}/sub/ " not in recursive
    answer = as_json(gw, "list", top)
    assert sorted(s["path"] for s in answer["secrets"]) == [f"{top}/a", f"{top}/b"]
    assert answer["folders"] == [f"{top}/sub/"]
    everything = stdout(vault(gw, "list", "--recursive")) + json.dumps(answer)
    for value in values.values():
        assert value not in out + recursive + everything


def test_metadata_show_and_change(gw):
    path = f"team/{uid()}/meta"
    values = [planted(f"m{i}") for i in range(3)]
    put(gw, path, values[0], "--meta", "owner=ops")

    shown = stdout(vault(gw, "metadata", path))
    assert "max versions" in shown and "owner" in shown and "ops" in shown

    meta = as_json(gw, "metadata", path, "--max-versions", "2")
    assert meta["max_versions"] == 2
    for value in values[1:]:
        put(gw, path, value)
    meta = as_json(gw, "versions", path)
    assert [v["version"] for v in meta["versions"]] == [2, 3]
    assert "error: NoSuchSecret:" in stderr(vault(gw, "get", path, "--version", "1", expect=1))

    meta = as_json(gw, "metadata", path, "--set", "team=infra")
    assert meta["metadata"] == {"owner": "ops", "team": "infra"}  # --set keeps the other keys
    meta = as_json(gw, "metadata", path, "--unset", "owner")
    assert meta["metadata"] == {"team": "infra"}
    for value in values:
        assert value not in shown + json.dumps(meta)


# ============================================================================ bad input

def test_a_value_is_never_an_argument(gw):
    path = f"team/{uid()}/arg"
    value = planted("arg")
    proc = vault(gw, "put", path, value, input=b"ignored", expect=2)
    assert "never as an argument" in stderr(proc)
    assert "error: NoSuchSecret:" in stderr(vault(gw, "get", path, expect=1))


def test_empty_values_are_refused(gw, tmp_path):
    path = f"team/{uid()}/empty"
    for data in (b"", b"\n", b"\r\n"):
        proc = vault(gw, "put", path, input=data, expect=1)
        assert "error: EmptyValue:" in stderr(proc) and "stdin" in stderr(proc)
    (tmp_path / "empty").write_bytes(b"")
    proc = vault(gw, "put", path, "--from-file", str(tmp_path / "empty"), expect=1)
    assert "error: EmptyValue:" in stderr(proc)
    assert "error: NoSuchSecret:" in stderr(vault(gw, "get", path, expect=1))


def test_bad_paths_and_too_large_values(gw):
    for path in ("a//b", "a/b/", "/a"):
        assert "error: InvalidPath:" in stderr(vault(gw, "get", path, expect=1))
    assert "error: InvalidPath:" in stderr(vault(gw, "put", "a/b c", input=b"x", expect=1))
    proc = vault(gw, "put", f"team/{uid()}/big", input=b"x" * 70000, expect=1)
    assert "error: ValueTooLarge:" in stderr(proc)


def read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side of the pty is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_get_on_a_terminal(gw, tmp_path):
    """On a terminal text gets a newline (the prompt stays readable) and binary is refused."""
    text_path, bin_path = f"team/{uid()}/tty-text", f"team/{uid()}/tty-bin"
    value = planted("tty")
    put(gw, text_path, value)
    (tmp_path / "blob").write_bytes(b"\xff\xfe\x00")
    vault(gw, "put", bin_path, "--from-file", str(tmp_path / "blob"))
    for path, code in ((text_path, 0), (bin_path, 1)):
        master, slave = pty.openpty()
        try:
            proc = subprocess.run([str(ORGMEM), "vault", "get", path], env=env_for(gw),
                                  stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
                                  timeout=60, check=False)
            os.close(slave)
            shown = read_all(master)
        finally:
            os.close(master)
        assert proc.returncode == code, proc.stderr
        if code == 0:
            assert shown.replace(b"\r\n", b"\n") == value.encode() + b"\n"
        else:
            assert b"error: BinaryValue:" in proc.stderr and shown == b""


def test_kek_commands_still_work(gw):
    status = json.loads(stdout(vault(gw, "kek", "status", "--json")))
    assert "primary" in status and "objects_by_version" in status


def test_rotate_rewrap_retire_keeps_secrets_and_waits_for_uploads(tmp_path):
    """Through a gateway and the CLI: the secret store's objects are rewrapped with the rest, an
    upload in progress holds its KEK version until aborted, and after retiring the old version
    and a restart every secret still reads."""
    import boto3
    from botocore.config import Config

    gateway = Gateway(tmp_path / "data").start()
    try:
        value = planted("rot")
        vault(gateway, "put", "ops/rotated", input=value.encode())
        s3 = boto3.client("s3", endpoint_url=gateway.endpoint, aws_access_key_id=gateway.access_key,
                          aws_secret_access_key=gateway.secret_key, region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket="uploads")
        upload = s3.create_multipart_upload(Bucket="uploads", Key="slow")["UploadId"]
        status = as_json(gateway, "kek", "status")
        assert status["uploads_by_version"] == {"1": 1}
        # the vault's metadata and record objects are counted with the others
        assert status["objects_by_version"]["1"] >= 2 and status["secrets_by_version"] == {"1": 1}
        vault(gateway, "kek", "rotate")
        rewrap = vault(gateway, "rewrap", "--batch", "3")
        assert "Multipart uploads in progress" in stderr(rewrap) and "1 under version 1" in stderr(rewrap)
        status = as_json(gateway, "kek", "status")
        assert set(status["objects_by_version"]) == {"2"} and status["secrets_by_version"] == {"2": 1}
        table = stdout(vault(gateway, "kek", "status"))
        assert "uploads in progress" in table
        refused = vault(gateway, "kek", "retire", "1", expect=1)
        assert "1 multipart uploads in progress" in stderr(refused) and "abort" in stderr(refused)
        s3.abort_multipart_upload(Bucket="uploads", Key="slow", UploadId=upload)
        vault(gateway, "kek", "retire", "1")
        gateway.stop()
        gateway.start()
        assert stdout(vault(gateway, "get", "ops/rotated")) == value
        vault(gateway, "put", "ops/rotated", input=b"after the restart")
        assert stdout(vault(gateway, "get", "ops/rotated")) == "after the restart"
    finally:
        gateway.stop()


def test_data_restored_from_before_a_retire_reads_again_once_unretired(tmp_path):
    """A backup taken before `kek retire 1`, restored: the gateway refuses to start and says
    which command to run; `kek unretire` works on the keyring file with the gateway stopped."""
    import shutil

    gateway = Gateway(tmp_path / "data").start()
    try:
        vault(gateway, "put", "ops/kept", input=b"from before the backup")
        gateway.stop()
        shutil.copytree(tmp_path / "data", tmp_path / "backup")
        gateway.start()
        vault(gateway, "kek", "rotate")
        vault(gateway, "rewrap")
        vault(gateway, "kek", "retire", "1")
        gateway.stop()
        shutil.rmtree(tmp_path / "data")
        shutil.copytree(tmp_path / "backup", tmp_path / "data")
        with pytest.raises(RuntimeError):
            gateway.start(timeout=10)
        keyring = tmp_path / "data.keyring.json"
        assert f"orgmem vault kek unretire 1 --keyring {keyring.resolve()}" in gateway.log()
        done = subprocess.run([str(BIN / "orgmem"), "vault", "kek", "unretire", "1", "--keyring", str(keyring)],
                              capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        gateway.start()
        assert stdout(vault(gateway, "get", "ops/kept")) == "from before the backup"
    finally:
        gateway.stop()


def test_a_keyring_from_before_a_rotation_is_refused_at_start(tmp_path):
    """The keyring restored from a backup taken before `kek rotate`: the gateway started, could
    not read what version 2 wrapped, and a second rotate made a new key numbered 2. The seal
    record now keeps a check value per version, learnt at the rotation."""
    import shutil

    keyring = tmp_path / "data.keyring.json"
    gateway = Gateway(tmp_path / "data").start()
    try:
        shutil.copy2(keyring, tmp_path / "keyring-backup.json")
        vault(gateway, "kek", "rotate")
        vault(gateway, "put", "ops/after", input=b"wrapped under version 2")
        gateway.stop()
        shutil.copy2(tmp_path / "keyring-backup.json", keyring)
        with pytest.raises(RuntimeError):
            gateway.start(timeout=10)
        assert "lacks KEK version(s) [2]" in gateway.log()
        shutil.copy2(tmp_path / "keyring-backup.json", tmp_path / "stale.json")
        keyring.unlink()
        FileKeyring(tmp_path / "stale.json").rotate()  # another key numbered 2
        shutil.copy2(tmp_path / "stale.json", keyring)
        with pytest.raises(RuntimeError):
            gateway.start(timeout=10)
        assert "holds other keys for version(s) [2]" in gateway.log()
        # every copy of the rotated keyring lost: the operator goes on without version 2, whose
        # number stays taken
        shutil.copy2(tmp_path / "keyring-backup.json", keyring)
        gateway.env = {"ORGMEM_ACCEPT_MISSING_KEK_VERSIONS": "2"}
        gateway.start()
        assert "kek_versions_missing" in gateway.log()
        vault(gateway, "get", "ops/after", expect=1)  # wrapped under the lost version
        assert "3" in stdout(vault(gateway, "kek", "rotate"))
        vault(gateway, "put", "ops/later", input=b"under version 3")
        assert stdout(vault(gateway, "get", "ops/later")) == "under version 3"
    finally:
        gateway.stop()


# ============================================================================ orgmem run

CHILD_HASHES = ("import hashlib, os, sys\n"
                "for name in sys.argv[1:]:\n"
                "    value = os.environ.get(name)\n"
                "    print(name, hashlib.sha256(value.encode()).hexdigest() if value is not None else '-')\n"
                "sys.exit(int(os.environ.get('EXIT_WITH', '0')))\n")


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def empty_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


def run_env(gw: Gateway, creds: dict, home: Path, **extra: str) -> dict[str, str]:
    """The agent's environment with HOME, TMPDIR and the working directory all in ``home``."""
    return env_for(gw, creds, HOME=str(home), TMPDIR=str(home), **extra)


def assert_untouched(home: Path, *values: str) -> None:
    """``home`` is still empty, and no file anywhere below it holds a value."""
    found = [p for p in home.rglob("*")]
    for p in found:
        if p.is_file():
            data = p.read_bytes()
            assert not any(v.encode() in data for v in values), f"{p} holds a secret value"
    assert found == [], f"orgmem run left files behind: {found}"


@pytest.fixture(scope="module")
def agent_secrets(gw, agent):
    """Two secrets of the agent's own, one a JSON object: (api path, api value, db path, password)."""
    base = f"agents/{agent['name']}"
    api, password = planted("api"), planted("pw")
    put(gw, f"{base}/openai", api)
    put(gw, f"{base}/db", json.dumps({"user": "app", "password": password}))
    return f"{base}/openai", api, f"{base}/db", password


def test_run_passes_secrets_and_the_exit_code(gw, agent, agent_secrets, tmp_path):
    api_path, api, db_path, password = agent_secrets
    home = empty_home(tmp_path)
    proc = orgmem(gw, "run", "--secret", f"OPENAI_API_KEY={api_path}",
                  "--secret", f"DB_PASSWORD={db_path}#password",
                  "--", sys.executable, "-c", CHILD_HASHES, "OPENAI_API_KEY", "DB_PASSWORD", "HOME",
                  env=run_env(gw, agent, home, EXIT_WITH="7"), cwd=home, expect=7)
    lines = stdout(proc).splitlines()
    assert lines == [f"OPENAI_API_KEY {sha(api)}", f"DB_PASSWORD {sha(password)}", f"HOME {sha(str(home))}"]
    assert api not in stdout(proc) and password not in stdout(proc)
    assert_untouched(home, api, password)


def test_run_does_not_hand_the_launchers_keys_to_the_command(gw, agent, agent_secrets, tmp_path):
    api_path, api, _, _ = agent_secrets
    names = ("ORGMEM_ACCESS_KEY", "ORGMEM_SECRET_KEY", "ORGMEM_ROOT_ACCESS_KEY", "ORGMEM_ROOT_SECRET_KEY")
    env = {**env_for(gw, agent), "ORGMEM_ROOT_ACCESS_KEY": gw.access_key,
           "ORGMEM_ROOT_SECRET_KEY": gw.secret_key}
    proc = orgmem(gw, "run", "--secret", f"K={api_path}", "--", sys.executable, "-c", CHILD_HASHES,
                  "K", *names, env=env)
    assert stdout(proc).splitlines() == [f"K {sha(api)}"] + [f"{name} -" for name in names]
    proc = orgmem(gw, "run", "--keep-credentials", "--secret", f"K={api_path}", "--", sys.executable,
                  "-c", CHILD_HASHES, *names, env=env)
    assert stdout(proc).splitlines() == [f"ORGMEM_ACCESS_KEY {sha(agent['access_key'])}",
                                         f"ORGMEM_SECRET_KEY {sha(agent['secret_key'])}",
                                         "ORGMEM_ROOT_ACCESS_KEY -", "ORGMEM_ROOT_SECRET_KEY -"]


def test_run_replaces_itself_with_the_command(gw, agent, agent_secrets):
    """The child runs as the very process that was started (execvpe): signals sent to it reach
    the command, and nothing of orgmem stays behind to wait."""
    api_path = agent_secrets[0]
    proc = subprocess.Popen([str(ORGMEM), "run", "--secret", f"K={api_path}", "--", sys.executable, "-c",
                             "import os; print(os.getpid())"], env=env_for(gw, agent),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert int(out) == proc.pid


def test_run_with_an_env_file(gw, agent, agent_secrets, tmp_path):
    api_path, api, db_path, password = agent_secrets
    home = empty_home(tmp_path)
    env_file = tmp_path / ".env.orgmem"
    env_file.write_text(f"# secrets for the agent\n\nOPENAI_API_KEY={api_path}\n"
                        f"  DB_PASSWORD={db_path}#password  \nDB_USER={db_path}#user\n")
    proc = orgmem(gw, "run", "--env-file", str(env_file), "--secret", f"DB_USER={api_path}",
                  "--", sys.executable, "-c", CHILD_HASHES, "OPENAI_API_KEY", "DB_PASSWORD", "DB_USER",
                  env=run_env(gw, agent, home), cwd=home)
    assert stdout(proc).splitlines() == [f"OPENAI_API_KEY {sha(api)}", f"DB_PASSWORD {sha(password)}",
                                         f"DB_USER {sha(api)}"]  # --secret overrides the file
    assert_untouched(home, api, password)


def test_run_starts_nothing_when_a_secret_cannot_be_fetched(gw, admin, agent, agent_secrets, tmp_path):
    api_path, api, _, _ = agent_secrets
    other = admin.create_agent(uid("ot"))
    theirs = f"agents/{other['name']}/token"
    put(gw, theirs, planted("theirs"))
    missing = f"agents/{agent['name']}/missing"
    home = empty_home(tmp_path)
    proc = orgmem(gw, "run", "--secret", f"MINE={api_path}", "--secret", f"THEIRS={theirs}",
                  "--secret", f"GONE={missing}",
                  "--", sys.executable, "-c", "open('started', 'w').write('yes')",
                  env=run_env(gw, agent, home), cwd=home, expect=1)
    err = stderr(proc)
    assert f"cannot set THEIRS from {theirs}: AccessDenied" in err
    assert f"cannot set GONE from {missing}: NoSuchSecret" in err
    assert "MINE" not in err and "nothing was started" in err
    assert_untouched(home, api)

    down = env_for(gw, agent, ORGMEM_ENDPOINT=f"http://127.0.0.1:{free_port()}")  # nobody listens
    proc = orgmem(gw, "run", "--secret", f"MINE={api_path}", "--", sys.executable, "-c", "print('ran')",
                  env=down, expect=1)
    assert f"cannot set MINE from {api_path}: ConnectionError" in stderr(proc) and stdout(proc) == ""


def test_run_refuses_binary_and_non_object_fields(gw, agent, tmp_path):
    base = f"agents/{agent['name']}"
    (tmp_path / "blob").write_bytes(b"\xff\xfe" + planted("bin").encode())
    vault(gw, "put", f"{base}/blob", "--from-file", str(tmp_path / "blob"))
    put(gw, f"{base}/plain", planted("plain"))
    proc = orgmem(gw, "run", "--secret", f"BLOB={base}/blob", "--", sys.executable, "-c", "print('ran')",
                  creds=agent, expect=1)
    assert f"cannot set BLOB from {base}/blob: BinaryValue" in stderr(proc) and stdout(proc) == ""
    proc = orgmem(gw, "run", "--secret", f"P={base}/plain#key", "--", sys.executable, "-c", "print('ran')",
                  creds=agent, expect=1)
    assert "NotAJSONObject" in stderr(proc) and stdout(proc) == ""


def test_run_bad_inputs(gw, agent, agent_secrets, tmp_path):
    api_path = agent_secrets[0]
    child = ["--", sys.executable, "-c", "print('ran')"]
    for spec, message in ((f"1BAD={api_path}", "not a valid environment variable name"),
                          (f"BAD-NAME={api_path}", "not a valid environment variable name"),
                          ("NOPATH=", "needs a secret path"), (f"F={api_path}#", "empty field"),
                          ("JUSTANAME", "expected ENV=PATH")):
        proc = orgmem(gw, "run", "--secret", spec, *child, creds=agent, expect=2)
        assert message in stderr(proc) and stdout(proc) == ""

    bad = tmp_path / "bad.env"
    bad.write_text(f"# ok\nGOOD={api_path}\n\nexport X={api_path}\n")
    proc = orgmem(gw, "run", "--env-file", str(bad), *child, creds=agent, expect=1)
    assert f"{bad}, line 4:" in stderr(proc) and stdout(proc) == ""
    dotenv = tmp_path / ".env"  # a dotenv file with values, given by mistake: none is repeated
    value = planted("dotenv")
    dotenv.write_text(f'TOKEN="{value} with spaces"\n')
    proc = orgmem(gw, "run", "--env-file", str(dotenv), *child, creds=agent, expect=1)
    assert f"{dotenv}, line 1: TOKEN= needs a secret path" in stderr(proc)
    twice = tmp_path / "twice.env"
    twice.write_text(f"A={api_path}\nA={api_path}\n")
    proc = orgmem(gw, "run", "--env-file", str(twice), *child, creds=agent, expect=1)
    assert "A is mapped twice" in stderr(proc) and f"{twice}:1" in stderr(proc)

    proc = orgmem(gw, "run", "--secret", f"A={api_path}", sys.executable, "-c", "print('ran')",
                  creds=agent, expect=2)
    assert "put `--` before the command" in stderr(proc)
    proc = orgmem(gw, "run", "--secret", f"A={api_path}", "--", creds=agent, expect=2)
    assert "no command after `--`" in stderr(proc)
    proc = orgmem(gw, "run", "--secret", f"A={api_path}", "--", "no-such-command-" + uid(),
                  creds=agent, expect=127)
    assert "command not found" in stderr(proc)


def test_run_passes_the_child_its_own_flags(gw, agent, agent_secrets):
    api_path, api, _, _ = agent_secrets
    proc = orgmem(gw, "run", "--secret", f"K={api_path}", "--", sys.executable, "-c",
                  "import sys; print(sys.argv[1:])", "--secret", "--help", "-x", creds=agent)
    assert stdout(proc).strip() == "['--secret', '--help', '-x']"


def test_run_without_secrets_just_runs(gw, tmp_path):
    env = {k: v for k, v in clean_env().items() if not k.startswith("ORGMEM_")}
    proc = orgmem(gw, "run", "--", sys.executable, "-c", "import sys; sys.exit(3)", env=env, expect=3)
    assert stdout(proc) == ""

