"""``orgmem run``: start a command with secrets from the vault in its environment.

    orgmem run --secret OPENAI_API_KEY=agents/scout/openai \\
               --secret DB_PASSWORD=agents/scout/db#password -- python agent.py
    orgmem run --env-file .env.orgmem -- python agent.py

Every secret is fetched first, with the caller's identity (the same environment credentials
as every other command). If any cannot be fetched, nothing is started. Then orgmem *becomes*
the command (``os.execvpe``): signals reach it directly, its exit code is the exit code, and
the values exist only in its environment, never in a file, an argument or a log line.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import click

from .admin_cli import _Settings, gateway_options
from .admin_client import AdminError
from .vault_client import VaultClient, secret_field, secret_value

#: Names a POSIX shell accepts, so the child can use every variable we set.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Exit codes of a shell for a command that cannot be found / cannot be executed.
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
_ARGV_KEY = "orgmem.run.argv"


@dataclass(frozen=True)
class SecretRef:
    """One ``ENV=PATH[#FIELD]`` mapping and where it was written (for error messages)."""

    env: str
    path: str
    field: str | None
    origin: str


def parse_ref(text: str, origin: str) -> SecretRef:
    """``ENV=PATH[#FIELD]`` as a SecretRef; ValueError otherwise.

    Messages quote the ENV name at most: an env file given by mistake may be a dotenv file
    full of real values, and those must not be copied to the terminal.
    """
    env, sep, target = text.partition("=")
    if not sep:
        raise ValueError("expected ENV=PATH[#FIELD] (there is no '=')")
    if not ENV_NAME.fullmatch(env):
        raise ValueError(f"{env!r} is not a valid environment variable name "
                         "(letters, digits and _, not starting with a digit)")
    path, hash_, field = target.partition("#")
    if not path or any(c.isspace() for c in path):
        raise ValueError(f"{env}= needs a secret path, without spaces")
    if hash_ and not field:
        raise ValueError(f"{env}= has an empty field after '#'")
    return SecretRef(env, path, field or None, origin)


def read_env_file(filename: str) -> list[SecretRef]:
    """The mappings of an env file: one ``ENV=PATH[#FIELD]`` a line, blank lines and ``#``
    comments allowed. It holds paths, not values, so it can be committed beside the code."""
    try:
        with open(filename, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise AdminError(0, "InvalidEnvFile", f"cannot read {filename}: {exc}") from None
    refs = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            refs.append(parse_ref(text, f"{filename}:{number}"))
        except ValueError as exc:
            raise AdminError(0, "InvalidEnvFile", f"{filename}, line {number}: {exc}") from None
    return refs


def merge_refs(file_refs: Sequence[SecretRef], cli_refs: Sequence[SecretRef]) -> list[SecretRef]:
    """The env file's mappings overridden by --secret ones of the same ENV (a local override
    of a shared file); the same ENV twice within one source is a mistake and refused."""
    merged: dict[str, SecretRef] = {}
    for source in (file_refs, cli_refs):
        seen: dict[str, SecretRef] = {}
        for ref in source:
            if ref.env in seen:
                raise AdminError(0, "DuplicateEnv", f"{ref.env} is mapped twice ({seen[ref.env].origin} "
                                 f"and {ref.origin})")
            seen[ref.env] = ref
        merged.update(seen)
    return list(merged.values())


def env_value(value: str | bytes, ref: SecretRef) -> str:
    """The text an environment variable gets; binary values and NUL bytes cannot be one."""
    where = f"{ref.path} (for {ref.env})"
    if ref.field:
        value = secret_field(value, ref.field, where)
    if isinstance(value, bytes):
        raise AdminError(0, "BinaryValue", f"{where} is a binary value; environment variables hold "
                         "text only (fetch it with `orgmem vault get PATH > FILE` instead)")
    if "\x00" in value:
        raise AdminError(0, "BinaryValue", f"{where} contains a NUL character, which an environment "
                         "variable cannot hold")
    return value


def fetch_all(client: VaultClient, refs: Iterable[SecretRef]) -> tuple[dict[str, str], list[str]]:
    """Every ref's value, and one error line per ref that failed (naming ENV and PATH, never a
    value). Each path is fetched once, so several fields of one secret come from one version."""
    answers: dict[str, str | bytes | AdminError] = {}
    values, errors = {}, []
    for ref in refs:
        if ref.path not in answers:
            try:
                answers[ref.path] = secret_value(client.get(ref.path))
            except AdminError as exc:
                answers[ref.path] = exc
        answer = answers[ref.path]
        try:
            if isinstance(answer, AdminError):
                raise AdminError(answer.status, answer.code, answer.message)
            values[ref.env] = env_value(answer, ref)
        except AdminError as exc:
            errors.append(f"error: cannot set {ref.env} from {ref.path}: {exc.code}: {exc.message}")
    return values, errors


def exec_command(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Replace this process with ``argv`` (looked up on the child's PATH). Returns only by
    exiting, with a shell's codes, when the command cannot be started."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], list(argv), dict(env))
    except FileNotFoundError:
        click.echo(f"error: {argv[0]}: command not found", err=True)
        sys.exit(EXIT_NOT_FOUND)
    except OSError as exc:
        click.echo(f"error: {argv[0]}: cannot execute: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_NOT_EXECUTABLE)


class _RunCommand(click.Command):
    """Takes everything after ``--`` as the command, untouched, before click parses options:
    the child's own flags (``--port``, ``-c``) must never be read as orgmem's."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[_ARGV_KEY] = args[cut + 1:]
            args = args[:cut]
        elif not any(a in self.get_help_option_names(ctx) for a in args):
            # Checked before parsing: the command's own flags would otherwise be reported as
            # unknown options of `orgmem run`, which says nothing about the real mistake.
            raise click.UsageError("put `--` before the command: orgmem run --secret ENV=PATH -- CMD "
                                   "[ARGS]...", ctx)
        return super().parse_args(ctx, args)


def _secret_option(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[SecretRef]:
    refs = []
    for text in values:
        try:
            refs.append(parse_ref(text, f"--secret {text}"))
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
    return refs


def _fail(message: str) -> None:
    click.echo(message, err=True)
    sys.exit(1)


@click.command("run", cls=_RunCommand, options_metavar="[OPTIONS] -- CMD [ARGS]...")
@click.option("--secret", "secrets", multiple=True, metavar="ENV=PATH[#FIELD]", callback=_secret_option,
              help="Set ENV to the secret at PATH (or to key FIELD of its JSON-object value). Repeatable.")
@click.option("--env-file", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Read ENV=PATH[#FIELD] lines from FILE (blank lines and # comments allowed); "
                   "--secret overrides a line of the same ENV. By convention: .env.orgmem.")
@click.option("--keep-credentials", is_flag=True,
              help="Pass your own ORGMEM_ACCESS_KEY / ORGMEM_SECRET_KEY on to CMD (dropped by "
                   "default; ORGMEM_ROOT_* are always dropped).")
@gateway_options
@click.pass_context
def run(ctx: click.Context, secrets: list[SecretRef], env_file: str | None, keep_credentials: bool,
        endpoint: str | None, ca_bundle: str | None) -> None:
    """Run CMD with secrets from the vault in its environment.

    Every secret is fetched first, as you (ORGMEM_ACCESS_KEY / ORGMEM_SECRET_KEY, else
    ORGMEM_ROOT_*). If any cannot be fetched, CMD is not started and the exit code is 1.
    Then orgmem replaces itself with CMD, so CMD gets the signals and its exit code is
    returned; the values live only in CMD's environment, never in a file.

    \b
    A secret's value replaces a variable of the same name already set. Values must be
    text (binary secrets are refused). `--` before CMD is required. Your own orgmem keys
    are not passed on (a sandbox gets what it is given, not its launcher's identity):
    ORGMEM_ROOT_* never, ORGMEM_ACCESS_KEY / ORGMEM_SECRET_KEY only with --keep-credentials.

    \b
      orgmem run --secret GITHUB_TOKEN=agents/scout/github -- gh repo list
      orgmem run --secret PGPASSWORD=agents/scout/db#password -- psql -h db
      orgmem run --env-file .env.orgmem -- python agent.py
    """
    argv = ctx.meta[_ARGV_KEY]
    if not argv:
        raise click.UsageError("no command after `--`")
    try:
        refs = merge_refs(read_env_file(env_file) if env_file else [], secrets)
        client = VaultClient.over(_Settings(endpoint, ca_bundle).client()) if refs else None
    except AdminError as exc:
        return _fail(f"error: {exc.code}: {exc.message}")
    values, errors = fetch_all(client, refs) if client else ({}, [])
    if errors:
        return _fail("\n".join(errors + ["error: nothing was started"]))
    exec_command(argv, {**child_environment(os.environ, keep_credentials), **values})


#: The launcher's own credentials: a child gets them only when asked (never the root's).
_ROOT_KEYS = ("ORGMEM_ROOT_ACCESS_KEY", "ORGMEM_ROOT_SECRET_KEY")
_CALLER_KEYS = ("ORGMEM_ACCESS_KEY", "ORGMEM_SECRET_KEY")


def child_environment(env: Mapping[str, str], keep_credentials: bool) -> dict[str, str]:
    """The environment CMD starts from: the caller's, minus the keys that identify the caller."""
    dropped = _ROOT_KEYS + (() if keep_credentials else _CALLER_KEYS)
    return {name: value for name, value in env.items() if name not in dropped}
