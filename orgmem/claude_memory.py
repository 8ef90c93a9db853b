"""A backend for Claude's memory tool that keeps ``/memories`` in an orgmem workspace bucket.

The Anthropic SDK's memory tool (``memory_20250818``) lets Claude ``view``, ``create``,
``str_replace``, ``insert``, ``delete`` and ``rename`` files under ``/memories``; the client
side stores them.  Here they are objects ``memories/<path>`` in the agent's own workspace
bucket ``agent-<name>`` (created if missing), so they outlive the sandbox, are shared by
every session of the agent, and are searchable with the rest of its workspace.

    from anthropic import Anthropic
    from orgmem import Client
    from orgmem.claude_memory import OrgmemMemoryTool

    memory = OrgmemMemoryTool(Client())
    runner = Anthropic().beta.messages.tool_runner(model=..., max_tokens=2048, tools=[memory],
                                                   messages=[...])

Answers and error texts follow the SDK's own filesystem implementation
(``BetaLocalFilesystemMemoryTool``), so Claude sees what it was trained on.  A path outside
``/memories`` (``..``, another absolute path, a backslash, a control character) and a file
over ``max_file_bytes`` are refused with a ToolError before anything is written.  Edits are
compare-and-swap on the object's ETag: two sessions editing one file at once cannot lose
either's change silently; the loser is told to look again.

Every command is written once as a generator of client calls (``_Commands``), driven by
``OrgmemMemoryTool`` over :class:`orgmem.Client` and by ``AsyncOrgmemMemoryTool`` over
:class:`orgmem.AsyncClient`.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Generator
from typing import Any

try:
    from anthropic.lib.tools import BetaAbstractMemoryTool, BetaAsyncAbstractMemoryTool, ToolError
    from anthropic.types.beta import (
        BetaCacheControlEphemeralParam,
        BetaMemoryTool20250818CreateCommand,
        BetaMemoryTool20250818DeleteCommand,
        BetaMemoryTool20250818InsertCommand,
        BetaMemoryTool20250818RenameCommand,
        BetaMemoryTool20250818StrReplaceCommand,
        BetaMemoryTool20250818ViewCommand,
    )
except ImportError as exc:  # the rest of the SDK does without it
    raise ImportError("orgmem.claude_memory needs the Anthropic SDK with its memory tool: "
                      "pip install 'anthropic>=2.10'") from exc

from .aio import AsyncClient
from .client import Client
from .errors import NotFound, OrgmemError, PreconditionFailed

__all__ = ["OrgmemMemoryTool", "AsyncOrgmemMemoryTool", "MAX_FILE_BYTES"]

ROOT = "/memories"
DEFAULT_PREFIX = "memories/"
#: The largest memory file: the search index reads workspace text files up to 1 MiB.
MAX_FILE_BYTES = 1024 * 1024
#: S3's limit on a key, in UTF-8 bytes.
MAX_KEY_BYTES = 1024
MAX_LINES = 999_999
LINE_NUMBER_WIDTH = len(str(MAX_LINES))

#: A client call to make: (method name, arguments, keyword arguments); its answer (or error)
#: is sent back into the generator.
Call = tuple[str, tuple, dict]
Steps = Generator[Call, Any, Any]


# --------------------------------------------------------------------------- text helpers

def _format_size(size: int) -> str:
    """Sizes as the SDK's filesystem tool shows them (``0B``, ``512B``, ``1.5K``, ``2M``)."""
    if size == 0:
        return "0B"
    units = ["B", "K", "M", "G"]
    i = min((size.bit_length() - 1) // 10, len(units) - 1)
    value = size / (1024 ** i)
    return f"{int(value)}{units[i]}" if value == int(value) else f"{value:.1f}{units[i]}"


def _split_lines_keeping_cr(content: str) -> list[str]:
    lines = content.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _numbered(lines: list[str], start: int) -> str:
    return "\n".join(f"{str(i + start).rjust(LINE_NUMBER_WIDTH)}\t{line}" for i, line in enumerate(lines))


def _decode(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"The file {path} is not UTF-8 text.") from None


def check_path(path: object, prefix: str = DEFAULT_PREFIX) -> str:
    """The path below ``/memories`` ("" for the root itself), or a ToolError saying why not.

    Refused: anything not under ``/memories``, ``.``/``..`` segments, empty segments,
    backslashes and control characters (NUL included).  Nothing is normalised away, so no
    two spellings name one object and no spelling leaves the prefix.
    """
    if not isinstance(path, str):
        raise ToolError(f"The path must be a string, got: {type(path).__name__}")
    if any(unicodedata.category(ch) == "Cc" for ch in path):
        raise ToolError(f"Path {path!r} contains a control character; memory paths are plain text")
    if "\\" in path:
        raise ToolError(f"Path {path} contains a backslash; separate folders with /")
    if path != ROOT and not path.startswith(ROOT + "/"):
        raise ToolError(f"Path must start with /memories, got: {path}")
    rel = path[len(ROOT) + 1:]
    if rel.endswith("/"):
        rel = rel[:-1]  # a folder may be named with its trailing slash
    if not rel:
        return ""
    segments = rel.split("/")
    if any(s in (".", "..") for s in segments):
        raise ToolError(f"Path {path} would escape /memories directory")
    if any(not s for s in segments):
        raise ToolError(f"Path {path} has an empty segment (a doubled /)")
    if len((prefix + rel).encode("utf-8")) > MAX_KEY_BYTES:
        raise ToolError(f"Path {path} is too long: keys are at most {MAX_KEY_BYTES} bytes")
    return rel


# --------------------------------------------------------------------------- the commands

class _Commands:
    """The memory commands as generators of client calls: the same logic for both clients."""

    def __init__(self, bucket: str | None, prefix: str, max_file_bytes: int) -> None:
        if prefix and not prefix.endswith("/"):
            raise ValueError("prefix must end with '/' (or be empty: the whole bucket)")
        self.bucket = bucket
        self.prefix = prefix
        self.max_file_bytes = max_file_bytes
        self.ready = False

    # -- storage -------------------------------------------------------------------------

    def prepare(self) -> Steps:
        """Resolve the bucket (``agent-<name>`` of the caller) and create it if missing."""
        if self.ready:
            return
        if self.bucket is None:
            me = yield _call("whoami")
            self.bucket = f"agent-{me['name']}"
        if not (yield _call("bucket_exists", self.bucket)):
            yield _call("create_bucket", self.bucket)
        self.ready = True

    def _key(self, rel: str) -> str:
        return self.prefix + rel

    def _below(self, rel: str) -> str:
        """The key prefix of everything inside folder ``rel``."""
        return self.prefix + (rel + "/" if rel else "")

    def _objects(self, rel: str) -> Steps:
        """{path below folder ``rel``: size} of every object inside it."""
        below = self._below(rel)
        listed = yield _call("list_files", self.bucket, below)
        return {o["key"][len(below):]: o["size"] for o in listed if "key" in o}

    def _kind(self, rel: str) -> Steps:
        """"file", "dir" or None: what ``rel`` names (the root is always a folder)."""
        if not rel:
            return "dir"
        key = self._key(rel)
        listed = yield _call("list_files", self.bucket, key, delimiter="/")
        if any(o.get("key") == key for o in listed):
            return "file"
        if any(o.get("prefix") == key + "/" for o in listed):
            return "dir"
        return None

    def _check_parents(self, rel: str, path: str) -> Steps:
        """A file cannot be put below something that is a file."""
        segments = rel.split("/")
        for n in range(1, len(segments)):
            if (yield from self._kind("/".join(segments[:n]))) == "file":
                raise ToolError(f"Cannot create {path}: {ROOT}/{'/'.join(segments[:n])} is a file")

    def _read(self, rel: str, path: str) -> Steps:
        """(text, etag) of a file, or the filesystem tool's errors."""
        try:
            data = yield _call("read_file", self.bucket, self._key(rel))
        except NotFound:
            if (yield from self._kind(rel)) == "dir":
                raise ToolError(f"The path {path} is not a file.") from None
            raise ToolError(f"The path {path} does not exist. Please provide a valid path.") from None
        return _decode(data, path), data.etag

    def _check_size(self, text: str, path: str) -> bytes:
        if not isinstance(text, str):
            raise ToolError(f"The content for {path} must be text.")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise ToolError(f"The content for {path} is not valid Unicode text. Nothing was written.") \
                from None
        if len(data) > self.max_file_bytes:
            raise ToolError(f"File {path} would be {len(data)} bytes; memory files are at most "
                            f"{self.max_file_bytes} bytes. Nothing was written.")
        return data

    def _write(self, rel: str, path: str, text: str, etag: str) -> Steps:
        data = self._check_size(text, path)
        try:
            yield _call("write_file", self.bucket, self._key(rel), data, if_match=etag)
        except PreconditionFailed:
            raise ToolError(f"The file {path} was changed by another session while it was being edited; "
                            "nothing was written. View it again and retry.") from None

    # -- view ----------------------------------------------------------------------------

    def view(self, path: str, view_range: list[int] | None) -> Steps:
        rel = check_path(path, self.prefix)
        kind = yield from self._kind(rel)
        if kind == "file":
            return (yield from self._view_file(rel, path, view_range))
        if kind is None:
            raise ToolError(f"The path {path} does not exist. Please provide a valid path.")
        return (yield from self._view_dir(rel))

    def _view_file(self, rel: str, path: str, view_range: list[int] | None) -> Steps:
        text, _ = yield from self._read(rel, path)
        lines = text.split("\n")
        if len(lines) > MAX_LINES:
            raise ToolError(f"File {path} exceeds maximum line limit of 999,999 lines.")
        start = 1
        if view_range and len(view_range) == 2:
            first = max(1, view_range[0]) - 1
            last = len(lines) if view_range[1] == -1 else view_range[1]
            lines, start = lines[first:last], first + 1
        return f"Here's the content of {path} with line numbers:\n" + _numbered(lines, start)

    def _view_dir(self, rel: str) -> Steps:
        """The listing the filesystem tool gives: two levels, dot files hidden; a folder's
        size is what is stored below it."""
        shown = ROOT + (f"/{rel}" if rel else "")
        objects = yield from self._objects(rel)
        tree: dict[str, Any] = {}
        sizes: dict[str, int] = {}
        for name, size in objects.items():
            parts = name.split("/")
            for n in range(1, len(parts)):
                folder = "/".join(parts[:n]) + "/"
                sizes[folder] = sizes.get(folder, 0) + size
            node = tree
            for depth, part in enumerate(parts, 1):
                if not part or part.startswith("."):
                    break  # hidden (its folders stay)
                if depth == len(parts):
                    node[part] = size
                else:
                    node = node.setdefault(part + "/", {})
        lines = [f"{_format_size(sum(objects.values()))}\t{shown}"]
        self._walk(tree, sizes, shown, "", 1, lines)
        header = f"Here're the files and directories up to 2 levels deep in {shown}, excluding hidden items:"
        return f"{header}\n" + "\n".join(lines)

    def _walk(self, node: dict, sizes: dict[str, int], shown: str, rel: str, depth: int,
              lines: list[str]) -> None:
        for name in sorted(node, key=lambda n: n.rstrip("/")):
            child = node[name]
            if isinstance(child, dict):
                lines.append(f"{_format_size(sizes[rel + name])}\t{shown}/{rel}{name}")
                if depth < 2:
                    self._walk(child, sizes, shown, rel + name, depth + 1, lines)
            else:
                lines.append(f"{_format_size(child)}\t{shown}/{rel}{name}")

    # -- create, edit --------------------------------------------------------------------

    def create(self, path: str, file_text: str) -> Steps:
        rel = check_path(path, self.prefix)
        if not rel:
            raise ToolError(f"Cannot create {path}: it is the /memories directory itself")
        data = self._check_size(file_text, path)
        if (yield from self._kind(rel)) == "dir":
            raise ToolError(f"Cannot create {path}: it is a directory")
        yield from self._check_parents(rel, path)
        try:
            yield _call("write_file", self.bucket, self._key(rel), data, create_only=True)
        except PreconditionFailed:
            raise ToolError(f"File {path} already exists") from None
        return f"File created successfully at: {path}"

    def str_replace(self, path: str, old_str: str, new_str: str) -> Steps:
        rel = check_path(path, self.prefix)
        if not rel:
            raise ToolError(f"The path {path} is not a file.")
        content, etag = yield from self._read(rel, path)
        count = content.count(old_str)
        if count == 0:
            raise ToolError(f"No replacement was performed, old_str `{old_str}` did not appear verbatim "
                            f"in {path}.")
        if count > 1:
            lines, start = [], 0
            while (pos := content.find(old_str, start)) != -1:
                lines.append(content[:pos].count("\n") + 1)
                start = pos + 1
            raise ToolError(f"No replacement was performed. Multiple occurrences of old_str `{old_str}` in "
                            f"lines: {', '.join(map(str, lines))}. Please ensure it is unique")
        changed = content[:content.find(old_str)].count("\n")
        new_content = content.replace(old_str, new_str)
        yield from self._write(rel, path, new_content, etag)
        new_lines = new_content.split("\n")
        first, last = max(0, changed - 2), min(len(new_lines), changed + 3)
        return ("The memory file has been edited. Here is the snippet showing the change (with line "
                "numbers):\n" + _numbered(new_lines[first:last], first + 1))

    def insert(self, path: str, insert_line: int, insert_text: str) -> Steps:
        rel = check_path(path, self.prefix)
        if not rel:
            raise ToolError(f"The path {path} is not a file.")
        content, etag = yield from self._read(rel, path)
        lines = _split_lines_keeping_cr(content)
        if not isinstance(insert_line, int) or insert_line < 0 or insert_line > len(lines):
            raise ToolError(f"Invalid `insert_line` parameter: {insert_line}. It should be within the range "
                            f"[0, {len(lines)}].")
        lines.insert(insert_line, insert_text.rstrip("\n"))
        new_content = "\n".join(lines)
        if not new_content.endswith("\n"):
            new_content += "\n"
        yield from self._write(rel, path, new_content, etag)
        return f"The file {path} has been edited."

    # -- delete, rename ------------------------------------------------------------------

    def delete(self, path: str) -> Steps:
        rel = check_path(path, self.prefix)
        if not rel:
            raise ToolError("Cannot delete the /memories directory itself")
        kind = yield from self._kind(rel)
        if kind == "file":
            yield _call("delete_file", self.bucket, self._key(rel))
        elif kind == "dir":
            for name in (yield from self._objects(rel)):
                yield _call("delete_file", self.bucket, self._below(rel) + name)
        else:
            raise ToolError(f"The path {path} does not exist")
        return f"Successfully deleted {path}"

    def rename(self, old_path: str, new_path: str) -> Steps:
        old, new = check_path(old_path, self.prefix), check_path(new_path, self.prefix)
        if not old:
            raise ToolError("Cannot rename the /memories directory itself")
        if not new or (yield from self._kind(new)) is not None:
            raise ToolError(f"The destination {new_path} already exists")
        kind = yield from self._kind(old)
        if kind is None:
            raise ToolError(f"The path {old_path} does not exist")
        if kind == "dir" and new.startswith(old + "/"):
            raise ToolError(f"Cannot move the directory {old_path} into itself")
        yield from self._check_parents(new, new_path)
        if kind == "file":
            moves = [(self._key(old), self._key(new))]
        else:
            names = yield from self._objects(old)
            moves = [(self._below(old) + n, self._below(new) + n) for n in names]
        for source, target in moves:
            try:
                yield _call("copy_file", self.bucket, source, self.bucket, target, create_only=True)
            except PreconditionFailed:
                raise ToolError(f"The destination {new_path} already exists") from None
            yield _call("delete_file", self.bucket, source)
        return f"Successfully renamed {old_path} to {new_path}"

    def clear_all(self) -> Steps:
        for name in (yield from self._objects("")):
            yield _call("delete_file", self.bucket, self._below("") + name)
        return "All memory cleared"


def _call(name: str, *args: Any, **kwargs: Any) -> Call:
    return name, args, kwargs


def _refused(exc: OrgmemError) -> ToolError:
    return ToolError(f"The memory store could not do this: {exc}")


# --------------------------------------------------------------------------- the tools

class OrgmemMemoryTool(BetaAbstractMemoryTool):
    """Claude's memory tool on an orgmem gateway (sync; for ``client.beta.messages.tool_runner``).

    ``bucket`` defaults to the caller's workspace ``agent-<name>``; it is created if missing.
    Files live under ``prefix`` (``memories/``) and are at most ``max_file_bytes``.
    """

    def __init__(self, client: Client, bucket: str | None = None, *, prefix: str = DEFAULT_PREFIX,
                 max_file_bytes: int = MAX_FILE_BYTES,
                 cache_control: BetaCacheControlEphemeralParam | None = None) -> None:
        super().__init__(cache_control=cache_control)
        self.client = client
        self._commands = _Commands(bucket, prefix, max_file_bytes)
        self._steps(self._commands.prepare())  # failures here are the developer's: OrgmemError

    @property
    def bucket(self) -> str:
        return self._commands.bucket

    def _drive(self, steps: Steps) -> Any:
        """Run a command; a failure of the store becomes a ToolError for Claude to read."""
        try:
            return self._steps(steps)
        except OrgmemError as exc:
            raise _refused(exc) from None

    def _steps(self, steps: Steps) -> Any:
        try:
            step = next(steps)
            while True:
                name, args, kwargs = step
                try:
                    result = getattr(self.client, name)(*args, **kwargs)
                except OrgmemError as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(result)
        except StopIteration as stop:
            return stop.value

    def view(self, command: BetaMemoryTool20250818ViewCommand) -> str:
        return self._drive(self._commands.view(command.path, command.view_range))

    def create(self, command: BetaMemoryTool20250818CreateCommand) -> str:
        return self._drive(self._commands.create(command.path, command.file_text))

    def str_replace(self, command: BetaMemoryTool20250818StrReplaceCommand) -> str:
        return self._drive(self._commands.str_replace(command.path, command.old_str, command.new_str))

    def insert(self, command: BetaMemoryTool20250818InsertCommand) -> str:
        return self._drive(self._commands.insert(command.path, command.insert_line, command.insert_text))

    def delete(self, command: BetaMemoryTool20250818DeleteCommand) -> str:
        return self._drive(self._commands.delete(command.path))

    def rename(self, command: BetaMemoryTool20250818RenameCommand) -> str:
        return self._drive(self._commands.rename(command.old_path, command.new_path))

    def clear_all_memory(self) -> str:
        return self._drive(self._commands.clear_all())


class AsyncOrgmemMemoryTool(BetaAsyncAbstractMemoryTool):
    """Claude's memory tool over :class:`orgmem.AsyncClient` (the bucket is resolved on first use)."""

    def __init__(self, client: AsyncClient, bucket: str | None = None, *, prefix: str = DEFAULT_PREFIX,
                 max_file_bytes: int = MAX_FILE_BYTES,
                 cache_control: BetaCacheControlEphemeralParam | None = None) -> None:
        super().__init__(cache_control=cache_control)
        self.client = client
        self._commands = _Commands(bucket, prefix, max_file_bytes)

    @property
    def bucket(self) -> str | None:
        return self._commands.bucket

    async def _steps(self, steps: Steps) -> Any:
        try:
            step = next(steps)
            while True:
                name, args, kwargs = step
                try:
                    result = await getattr(self.client, name)(*args, **kwargs)
                except OrgmemError as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(result)
        except StopIteration as stop:
            return stop.value

    async def _drive(self, steps: Steps) -> Any:
        """Run a command (resolving the bucket first); store failures become ToolErrors."""
        try:
            await self._steps(self._commands.prepare())
            return await self._steps(steps)
        except OrgmemError as exc:
            raise _refused(exc) from None

    async def view(self, command: BetaMemoryTool20250818ViewCommand) -> str:
        return await self._drive(self._commands.view(command.path, command.view_range))

    async def create(self, command: BetaMemoryTool20250818CreateCommand) -> str:
        return await self._drive(self._commands.create(command.path, command.file_text))

    async def str_replace(self, command: BetaMemoryTool20250818StrReplaceCommand) -> str:
        return await self._drive(self._commands.str_replace(command.path, command.old_str, command.new_str))

    async def insert(self, command: BetaMemoryTool20250818InsertCommand) -> str:
        return await self._drive(self._commands.insert(command.path, command.insert_line,
                                                       command.insert_text))

    async def delete(self, command: BetaMemoryTool20250818DeleteCommand) -> str:
        return await self._drive(self._commands.delete(command.path))

    async def rename(self, command: BetaMemoryTool20250818RenameCommand) -> str:
        return await self._drive(self._commands.rename(command.old_path, command.new_path))

    async def clear_all_memory(self) -> str:
        return await self._drive(self._commands.clear_all())
