"""``orgmem vault``: secrets, and the key-encryption key that seals everything at rest.

Secrets (``/v1/vault``): ``put``, ``get``, ``list``, ``versions``, ``rm``, ``undelete``,
``destroy`` and ``metadata`` are thin calls through ``VaultClient``, as the caller's identity.
A value is never taken from the command line, where shell history and ``ps`` would keep it:
``put`` reads it from a file or stdin, and values appear in no error message.

Key management: ``kek status|rotate|retire`` and ``rewrap``. The gateway holds the store (the
embedded one is locked to it), so these ask it to do the work over the admin API
(``admin:ManageKeys``), like ``orgmem admin``.

Every command uses the same ``--endpoint`` and credentials as ``orgmem admin``. Errors go to
stderr as ``error: <code>: <message>`` with exit code 1 (2 for usage errors).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import click

from .admin_cli import (
    KeyValue,
    _AdminGroup,
    _console,
    _details,
    _Settings,
    _table,
    gateway_options,
    json_option,
)
from .admin_client import AdminClient, AdminError
from .vault_client import MAX_VALUE_BYTES, VaultClient, secret_field, secret_value


def _client() -> AdminClient:
    settings = click.get_current_context().find_object(_Settings)
    if settings is None:  # a subcommand invoked on its own, outside `orgmem vault`
        settings = _Settings(None, None)
    return settings.client()


def _secrets() -> VaultClient:
    return VaultClient.over(_client())


def _call(method: str, path: str, body: dict | None = None) -> dict:
    payload = json.dumps(body).encode() if body is not None else b""
    _, _, data = _client()._request(method, "/admin/v1/vault/" + path, body=payload,
                                    content_type="application/json" if body is not None else None)
    return json.loads(data) if data else {}


@click.group(cls=_AdminGroup)
@gateway_options
@click.pass_context
def vault(ctx: click.Context, endpoint: str | None, ca_bundle: str | None) -> None:
    """Secrets (put, get, list, versions, rm, undelete, destroy, metadata), and the
    key-encryption key (KEK) that seals everything at rest (kek, rewrap).

    Credentials come from ORGMEM_ACCESS_KEY and ORGMEM_SECRET_KEY, else from
    ORGMEM_ROOT_ACCESS_KEY and ORGMEM_ROOT_SECRET_KEY.
    """
    ctx.obj = _Settings(endpoint, ca_bundle)


@vault.group()
def kek() -> None:
    """The KEK's versions: status, rotate, retire."""


@kek.command("status")
@json_option
def kek_status(as_json: bool) -> None:
    """Count objects and secret versions per KEK version (what rewrap has left to do)."""
    status = _call("GET", "kek")
    if as_json:
        click.echo(json.dumps(status, indent=2))
        return
    console = _console()
    console.print(f"KEK {status['kek_id']}: primary version {status['primary']}, "
                  f"versions {status['versions']}, retired {status['retired']}")
    objects, secrets = status["objects_by_version"], status.get("secrets_by_version", {})
    uploads = status.get("uploads_by_version", {})
    rows = [(version, objects.get(version, 0), secrets.get(version, 0), uploads.get(version, 0),
             "primary" if version == str(status["primary"]) else "")
            for version in sorted(set(objects) | set(secrets) | set(uploads))]
    console.print(_table(["version", "objects", "secret versions", "uploads in progress", ""], rows))


@kek.command("rotate")
@json_option
def kek_rotate(as_json: bool) -> None:
    """Make a new KEK version primary; new objects use it at once. Then run `orgmem vault rewrap`."""
    result = _call("POST", "kek/rotate")
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"KEK version {result['primary']} is now primary. Existing data keys stay "
                   "wrapped by older versions until `orgmem vault rewrap`.")


@kek.command("retire")
@click.argument("version", type=int)
def kek_retire(version: int) -> None:
    """Retire a KEK version; refused while any object, secret version or multipart upload in
    progress still uses it."""
    result = _call("POST", "kek/retire", {"version": version})
    click.echo(f"KEK version {result['retired']} is retired.")


@kek.command("unretire")
@click.argument("version", type=int)
@click.option("--keyring", type=click.Path(exists=True, dir_okay=False), required=True,
              help="The keyring file, as in --kek file:PATH.")
def kek_unretire(version: int, keyring: str) -> None:
    """Make a retired KEK version unwrap again, in the keyring file itself: for data
    restored from a backup taken before the retire. Works with the gateway stopped (it may
    refuse to start without this); a running gateway sees the change within a second."""
    from vault.errors import VaultError
    from vault.keys import FileKeyring

    try:
        FileKeyring(keyring).unretire(version)
    except VaultError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"KEK version {version} unwraps again. Rewrap and retire it once the restored "
               "data no longer needs it.")


@vault.command("rewrap")
@click.option("--resume", is_flag=True, help="Continue an interrupted rewrap from its checkpoint.")
@click.option("--batch", default=500, show_default=True, help="Objects per request.")
def rewrap(resume: bool, batch: int) -> None:
    """Rewrap every data key under the primary KEK version, without rewriting data.

    Safe while the gateway serves traffic; interrupted, continue with --resume.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    status = _call("GET", "kek")
    primary = str(status["primary"])
    pending = {**{f"o{v}": n for v, n in status["objects_by_version"].items() if v != primary},
               **{f"s{v}": n for v, n in status.get("secrets_by_version", {}).items() if v != primary}}
    total = sum(pending.values())  # objects, then the secrets' own data keys
    done = rewrapped = skipped = 0
    skipped_keys: list[str] = []
    columns = (TextColumn("rewrapping"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=_console(), transient=False) as progress:
        task = progress.add_task("rewrap", total=max(total, 1))
        while True:
            result = _call("POST", "rewrap", {"resume": resume, "limit": batch})
            resume = True  # every later batch continues from the checkpoint
            done += result["scanned"]
            rewrapped += result["rewrapped"]
            skipped += result.get("skipped", 0)
            skipped_keys += result.get("skipped_keys", [])
            progress.update(task, completed=min(rewrapped, total))
            if result["done"]:
                break
    if not skipped:
        click.echo(f"Rewrapped {rewrapped} of {done} objects; every data key is now under KEK "
                   f"version {result['primary']}.")
    else:
        click.echo(f"Rewrapped {rewrapped} of {done} objects under KEK version {result['primary']}; "
                   f"{skipped} could not be rewrapped (their wrapped data key is damaged or "
                   "missing; restore them from backup or delete them):", err=True)
        for name in skipped_keys:
            click.echo(f"  {name}", err=True)
        if len(skipped_keys) < skipped:
            click.echo(f"  ... and {skipped - len(skipped_keys)} more (see the gateway's log, "
                       "event rewrap_skipped)", err=True)
    after = _call("GET", "kek")
    older = {v: n for v, n in after.get("uploads_by_version", {}).items() if v != str(after["primary"])}
    if older:
        listed = ", ".join(f"{n} under version {v}" for v, n in sorted(older.items()))
        click.echo(f"Multipart uploads in progress keep the data key of their creation ({listed}): "
                   "retiring those versions is refused until they complete, expire or are "
                   "aborted.", err=True)
    if skipped:
        sys.exit(1)


# --------------------------------------------------------------------------- secrets: plumbing

def _dump(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def _strip_one_newline(raw: bytes) -> bytes:
    """Drop exactly one trailing "\\n" or "\\r\\n": what ``echo`` and here-strings add, while a
    value that really ends in blank lines keeps the rest."""
    if raw.endswith(b"\r\n"):
        return raw[:-2]
    if raw.endswith(b"\n"):
        return raw[:-1]
    return raw


def _read_limited(stream, source: str) -> bytes:
    """At most MAX_VALUE_BYTES (+2 for a newline) from ``stream``: a mistaken multi-gigabyte
    input is refused here instead of being read into memory and uploaded."""
    raw = stream.read(MAX_VALUE_BYTES + 3)
    if len(raw) > MAX_VALUE_BYTES + 2:
        raise AdminError(0, "ValueTooLarge", f"the value from {source} is larger than "
                         f"{MAX_VALUE_BYTES} bytes, the most a secret may hold")
    return raw


def _text_or_bytes(raw: bytes) -> str | bytes:
    """Valid UTF-8 is stored as text (readable in --json and usable in env vars); anything
    else is stored as bytes (sent base64) and comes back byte for byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _read_value(from_file: str | None) -> str | bytes:
    """The value to store: a file's exact bytes, a hidden prompt on a terminal, else stdin
    minus one trailing newline. Never a command-line argument."""
    if from_file is not None:
        with open(from_file, "rb") as f:
            raw = _read_limited(f, from_file)
        source = from_file
    elif sys.stdin.isatty():
        raw = click.prompt("Value (hidden)", hide_input=True, confirmation_prompt=True,
                           err=True).encode("utf-8")
        source = "the prompt"
    else:
        raw = _strip_one_newline(_read_limited(sys.stdin.buffer, "stdin"))
        source = "stdin"
    if len(raw) > MAX_VALUE_BYTES:
        raise AdminError(0, "ValueTooLarge", f"the value from {source} is larger than "
                         f"{MAX_VALUE_BYTES} bytes, the most a secret may hold")
    if not raw:
        raise AdminError(0, "EmptyValue", f"the value from {source} is empty; pipe the value in "
                         "(printf '%s' \"$VALUE\" | orgmem vault put PATH) or use --from-file FILE")
    return _text_or_bytes(raw)


def _write_value(value: str | bytes, where: str) -> None:
    """Write a value to stdout exactly: bytes as they are, text as UTF-8 with a newline added
    only on a terminal, so ``get > FILE`` and ``$(orgmem vault get ...)`` see the stored bytes.
    Binary is refused on a terminal, where it would garble the screen."""
    tty = sys.stdout.isatty()
    if isinstance(value, bytes):
        if tty:
            raise AdminError(0, "BinaryValue", f"{where} is a binary value; redirect stdout to a "
                             "file (orgmem vault get PATH > FILE) or use --json for base64")
        data = value
    else:
        data = value.encode("utf-8") + (b"\n" if tty and not value.endswith("\n") else b"")
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _pairs(items: Sequence[tuple[str, str]], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in items:
        if key in out:
            raise click.UsageError(f"{option} {key}=... is given twice")
        out[key] = value
    return out


def _versions_text(versions: Sequence[int]) -> str:
    return ("version " if len(versions) == 1 else "versions ") + ", ".join(str(v) for v in versions)


def _show_metadata(meta: Mapping[str, Any]) -> None:
    console = _console()
    console.print(_details([("path", meta.get("path")), ("current version", meta.get("current_version")),
                            ("max versions", meta.get("max_versions")),
                            ("created", meta.get("created_time")), ("updated", meta.get("updated_time"))]))
    custom = meta.get("metadata") or {}
    if custom:
        console.print(_table(["key", "value"], sorted(custom.items())))


version_option = click.option("--version", "versions", type=click.IntRange(min=1), multiple=True,
                              metavar="N", help="A version number (repeatable).")


# --------------------------------------------------------------------------- secrets: commands

@vault.command("put", context_settings={"allow_extra_args": True})
@click.argument("path")
@click.option("--from-file", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Read the value from FILE, byte for byte (nothing is stripped).")
@click.option("--cas", type=click.IntRange(min=0), metavar="N",
              help="Write only if version N is current (0: only if the path has no secret yet).")
@click.option("--meta", "meta", type=KeyValue(), multiple=True,
              help="Custom metadata KEY=VALUE (repeatable); when given, it replaces the path's metadata.")
@json_option
@click.pass_context
def put(ctx: click.Context, path: str, from_file: str | None, cas: int | None, meta: tuple,
        as_json: bool) -> None:
    """Store a new version of the secret at PATH.

    The value is read from --from-file, else from stdin (exactly one trailing newline,
    "\\n" or "\\r\\n", is stripped, so `echo` and `<<<` work), else, on a terminal, from a
    hidden prompt. It is never taken as an argument: shell history and `ps` would keep it.
    Valid UTF-8 is stored as text, anything else as binary. An empty value is refused.

    \b
      printf '%s' "$TOKEN" | orgmem vault put agents/scout/github
      orgmem vault put agents/scout/tls-key --from-file key.pem --cas 0
    """
    if ctx.args:  # caught here so that click's own message does not repeat the value
        raise click.UsageError("put reads the value from stdin or --from-file, never as an argument: "
                               "shell history and `ps` keep arguments (if that was a real secret, "
                               "consider it exposed and rotate it)")
    value = _read_value(from_file)
    metadata = _pairs(meta, "--meta") if meta else None
    answer = _secrets().put(path, value, metadata=metadata, cas=cas)
    if as_json:
        return _dump(answer)
    click.echo(f"{answer['path']}: version {answer['version']}")


@vault.command("get")
@click.argument("path")
@click.option("--version", type=click.IntRange(min=1), metavar="N",
              help="This version (default: the latest).")
@click.option("--field", metavar="KEY", help="The value is a JSON object: print only its KEY.")
@json_option
def get(path: str, version: int | None, field: str | None, as_json: bool) -> None:
    """Print the secret at PATH to stdout.

    Text is written exactly as stored, UTF-8, with a newline added only when stdout is a
    terminal; binary values are written raw (redirect them to a file). --field KEY prints
    one key of a JSON-object value (a non-string item as JSON). --json prints the whole
    answer (value, encoding, version, metadata, created time and author).
    """
    if as_json and field:
        raise click.UsageError("--field and --json cannot be combined")
    answer = _secrets().get(path, version)
    if as_json:
        return _dump(answer)
    where = f"{answer.get('path', path)} (version {answer.get('version')})"
    value = secret_value(answer)
    _write_value(secret_field(value, field, where) if field else value, where)


@vault.command("list")
@click.argument("prefix", default="")
@click.option("--recursive", "-r", is_flag=True, help="Every secret below PREFIX, not just one level.")
@json_option
def list_(prefix: str, recursive: bool, as_json: bool) -> None:
    """List the secrets and folders under PREFIX (default: everything you may list).

    Shows path, current version, last update and whether the latest version is deleted;
    never values. Folders end in "/".
    """
    answer = _secrets().list(prefix, recursive=recursive)
    if as_json:
        return _dump(answer)
    rows = [(s["path"], s.get("current_version"), s.get("updated_time"), s.get("deleted"))
            for s in answer.get("secrets", [])]
    rows += [(folder, None, None, None) for folder in answer.get("folders", [])]
    _console().print(_table(["path", "version", "updated", "deleted"], sorted(rows, key=lambda r: r[0])))


@vault.command("versions")
@click.argument("path")
@json_option
def versions(path: str, as_json: bool) -> None:
    """The kept versions of PATH, oldest first: when, by whom, deleted or destroyed."""
    meta = _secrets().metadata(path)
    if as_json:
        return _dump(meta)
    rows = [(v["version"], v.get("created_time"), v.get("created_by"), v.get("deleted_time"),
             v.get("destroyed")) for v in meta.get("versions", [])]
    caption = f"current version {meta.get('current_version')}, keeping at most {meta.get('max_versions')}"
    _console().print(_table(["version", "created", "by", "deleted", "destroyed"], rows, caption=caption))


@vault.command("rm")
@click.argument("path")
@version_option
def rm(path: str, versions: tuple[int, ...]) -> None:
    """Soft-delete the latest version of PATH (or the given ones); `undelete` restores them."""
    _secrets().delete(path, list(versions) if versions else None)
    what = _versions_text(versions) if versions else "the latest version"
    click.echo(f"{path}: deleted {what} (recoverable with `orgmem vault undelete`)")


@vault.command("undelete")
@click.argument("path")
@click.option("--version", "versions", type=click.IntRange(min=1), multiple=True, required=True,
              metavar="N", help="A version to restore (repeatable).")
@json_option
def undelete(path: str, versions: tuple[int, ...], as_json: bool) -> None:
    """Restore soft-deleted versions of PATH."""
    meta = _secrets().undelete(path, list(versions))
    if as_json:
        return _dump(meta)
    click.echo(f"{path}: restored {_versions_text(versions)}")


@vault.command("destroy")
@click.argument("path")
@version_option
@click.option("--all", "all_", is_flag=True, help="Destroy every version and forget PATH.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def destroy(path: str, versions: tuple[int, ...], all_: bool, yes: bool) -> None:
    """Destroy versions of PATH for good: IRREVERSIBLE, unlike `rm`.

    A destroyed version can never be read again, by anyone; its ciphertext is gone.
    Name the versions with --version N (repeatable), or everything with --all. Asks
    for confirmation unless --yes.
    """
    if bool(versions) == all_:
        raise click.UsageError("give --version N (repeatable) or --all, not both and not neither")
    what = "every version" if all_ else _versions_text(versions)
    if not yes:
        click.confirm(f"Destroy {what} of {path}? This cannot be undone: destroyed versions can "
                      "never be read again.", abort=True, err=True)
    if all_:
        _secrets().destroy_all(path)
        click.echo(f"{path}: destroyed every version; the path is gone")
    else:
        _secrets().destroy(path, list(versions))
        click.echo(f"{path}: destroyed {what}")


@vault.command("metadata")
@click.argument("path")
@click.option("--max-versions", type=click.IntRange(min=1), metavar="N",
              help="Keep at most N versions (older ones are dropped).")
@click.option("--set", "set_", type=KeyValue(), multiple=True,
              help="Set custom metadata KEY=VALUE (repeatable); other keys are kept.")
@click.option("--unset", multiple=True, metavar="KEY", help="Remove a custom metadata key (repeatable).")
@json_option
def metadata(path: str, max_versions: int | None, set_: tuple, unset: tuple[str, ...], as_json: bool) -> None:
    """Show the metadata of PATH, or change it with --max-versions, --set and --unset.

    Never shows values. --set/--unset read the current custom metadata and write it back
    changed (the API replaces it as a whole).
    """
    client = _secrets()
    if max_versions is None and not set_ and not unset:
        meta = client.metadata(path)
    else:
        custom = None
        if set_ or unset:
            custom = dict(client.metadata(path).get("metadata") or {})
            custom.update(_pairs(set_, "--set"))
            for key in unset:
                custom.pop(key, None)
        meta = client.set_metadata(path, max_versions=max_versions, metadata=custom)
    if as_json:
        return _dump(meta)
    _show_metadata(meta)
