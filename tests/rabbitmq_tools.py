"""RabbitMQ's own ``rabbitmqadmin`` script, fetched at test time from Debian's rabbitmq-server package.

Nothing of RabbitMQ is committed: ``apt-get download`` fetches the .deb into a cache under the
virtualenv running the tests, and the script is extracted from it (from the management plugin's
``priv/www/cli/``, or from the plugin's .ez zip where the package ships plugins zipped).
"""
from __future__ import annotations

import io
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

CACHE = Path(sys.prefix) / "cache" / "rabbitmqadmin"
SCRIPT_SUFFIX = "/priv/www/cli/rabbitmqadmin"


class Unavailable(Exception):
    """Why the script could not be had (the tests that need it skip with this reason)."""


def _ar_members(data: bytes) -> dict[str, bytes]:
    """The members of a Debian package (a plain ``ar`` archive)."""
    if not data.startswith(b"!<arch>\n"):
        raise Unavailable("downloaded file is not a Debian package")
    members, offset = {}, 8
    while offset + 60 <= len(data):
        header = data[offset:offset + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = data[offset + 60:offset + 60 + size]
        offset += 60 + size + (size & 1)
    return members


def _data_tar(deb: Path) -> tarfile.TarFile:
    members = _ar_members(deb.read_bytes())
    for name, payload in members.items():
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise Unavailable("data.tar.zst needs zstandard, which Python's tarfile cannot read")
            raw = lzma.decompress(payload) if name.endswith(".xz") else payload
            return tarfile.open(fileobj=io.BytesIO(raw), mode="r:*")
    raise Unavailable("no data.tar in the package")


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """A regular file's bytes."""
    file = tar.extractfile(member)
    assert file is not None  # (asked of regular files only)
    return file.read()


def _script_from(tar: tarfile.TarFile) -> bytes:
    for member in tar.getmembers():
        if member.isfile() and member.name.endswith(SCRIPT_SUFFIX) and "rabbitmq_management-" in member.name:
            return _read(tar, member)
    for member in tar.getmembers():
        if member.isfile() and "/rabbitmq_management-" in member.name and member.name.endswith(".ez"):
            with zipfile.ZipFile(io.BytesIO(_read(tar, member))) as ez:
                for name in ez.namelist():
                    if name.endswith(SCRIPT_SUFFIX):
                        return ez.read(name)
    raise Unavailable("rabbitmqadmin not found in the rabbitmq-server package")


def _download() -> Path:
    if shutil.which("apt-get") is None:
        raise Unavailable("apt-get is not available to download Debian's rabbitmq-server package")
    CACHE.mkdir(parents=True, exist_ok=True)

    def download() -> subprocess.CompletedProcess:
        return subprocess.run(["apt-get", "download", "rabbitmq-server"], cwd=CACHE, capture_output=True,
                              text=True, timeout=300)

    result = download()
    if result.returncode != 0 and os.geteuid() == 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=300)
        result = download()
    debs = sorted(CACHE.glob("rabbitmq-server_*.deb"))
    if result.returncode != 0 or not debs:
        raise Unavailable(f"apt-get download rabbitmq-server failed: {result.stderr.strip()[-300:]}")
    return debs[-1]


def rabbitmqadmin() -> Path:
    """The path of the cached script, downloading and extracting it the first time."""
    script = CACHE / "rabbitmqadmin"
    if script.exists():
        return script
    debs = sorted(CACHE.glob("rabbitmq-server_*.deb"))
    deb = debs[-1] if debs else _download()
    with _data_tar(deb) as tar:
        content = _script_from(tar)
    partial = script.with_suffix(".partial")
    partial.write_bytes(content)
    partial.replace(script)
    deb.unlink()  # the script is all the tests need
    return script
