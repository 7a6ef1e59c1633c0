"""Process-tree helpers for the tests that kill runs (Linux /proc)."""

from __future__ import annotations

from pathlib import Path


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first, then the parent pid)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``: children, their children, ... (also those in sessions of their
    own, as torchrun starts its workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = _stat_fields(stat.parent.name)
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """The (address, port) of every TCP socket ``pid`` listens on (from /proc/net/tcp and tcp6;
    IPv4 addresses dotted, IPv6 ones as 32 hex digits, all-zero for "every interface")."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.is_file():
            continue
        for line in path.read_text().splitlines()[1:]:
            f = line.split()
            local, state, inode = f[1], f[3], f[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = local.split(":")
            if len(hexaddr) == 8:  # IPv4, little-endian
                addr = ".".join(str(int(hexaddr[i : i + 2], 16)) for i in (6, 4, 2, 0))
            else:
                addr = hexaddr
            out.append((addr, int(hexport, 16)))
    return out
