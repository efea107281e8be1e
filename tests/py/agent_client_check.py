#!/usr/bin/env python3
"""Drive a sandbox agent with the published `agent-sandbox` client.

    agent_client_check.py BASE_URL FILE_ROOT

BASE_URL is the agent (http://127.0.0.1:8080) or a sandbox behind the
provisioner's proxy (http://HOST/api/sandboxes/ID/proxy, with the
provisioner's bearer token in the env SANDBOXD_TOKEN); FILE_ROOT is a
writable directory inside the sandbox (e.g. /tmp/check or
/home/gem/check). Exits non-zero on the first failed check; prints one line
per check.
"""

import io
import os
import sys
import time

from agent_sandbox import Sandbox
from agent_sandbox.core.api_error import ApiError


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok   {name}", flush=True)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    base_url, root = sys.argv[1], sys.argv[2].rstrip("/")
    token = os.environ.get("SANDBOXD_TOKEN") or os.environ.get("AGENT_CHECK_BEARER_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else None
    client = Sandbox(base_url=base_url, headers=headers, timeout=60)

    ctx = client.sandbox.get_context()
    check("get_context", bool(ctx.home_dir) and bool(ctx.version) and bool(ctx.detail.system.os),
          repr(ctx))

    r = client.shell.exec_command(command=f"mkdir -p {root}; echo hello; echo err >&2; exit 7")
    check("exec output", r.data.output == "hello\nerr\n", repr(r.data.output))
    check("exec exit code", r.data.exit_code == 7, repr(r.data.exit_code))
    check("exec status", r.data.status == "completed", repr(r.data.status))

    t0 = time.monotonic()
    r = client.shell.exec_command(command="echo started; sleep 30", timeout=3,
                                  request_options={"timeout_in_seconds": 3})
    took = time.monotonic() - t0
    check("exec timeout answered before N", took < 3.0, f"{took:.2f}s")
    check("exec timeout exit code", isinstance(r.data.exit_code, int) and r.data.exit_code != 0,
          repr(r.data.exit_code))
    check("exec timeout partial output", "started" in (r.data.output or ""), repr(r.data.output))

    path = f"{root}/docs/a.txt"
    w = client.file.write_file(file=path, content="l0\nl1\nl2\nl3\n")
    check("write", w.success and w.data.bytes_written == 12, repr(w))

    rd = client.file.read_file(file=path)
    check("read all", rd.data.content == "l0\nl1\nl2\nl3\n", repr(rd.data.content))
    rd = client.file.read_file(file=path, start_line=1, end_line=3)
    check("read range", rd.data.content == "l1\nl2\n", repr(rd.data.content))

    client.file.write_file(file=f"{root}/docs/.hidden", content="")
    client.file.write_file(file=f"{root}/docs/sub/b.py", content="print(1)\n")
    ls = client.file.list_path(path=f"{root}/docs")
    names = sorted(f.name for f in ls.data.files)
    check("list names", names == [".hidden", "a.txt", "sub"], repr(names))
    by_name = {f.name: f for f in ls.data.files}
    check("list shapes", by_name["a.txt"].size == 12 and not by_name["a.txt"].is_directory
          and by_name["sub"].is_directory and isinstance(by_name["a.txt"].modified_time, str)
          and by_name["a.txt"].path == path, repr(by_name["a.txt"]))
    check("list counts", (ls.data.total_count, ls.data.directory_count, ls.data.file_count) == (3, 1, 2),
          repr(ls.data))

    found = client.file.find_files(path=f"{root}/docs", glob="**/*.py")
    check("find", found.data.files == [f"{root}/docs/sub/b.py"], repr(found.data.files))

    ed = client.file.str_replace_editor(command="str_replace", path=path, old_str="l1", new_str="L1")
    check("str_replace", ed.data.prev_exist and ed.data.path == path, repr(ed.data))
    rd = client.file.read_file(file=path)
    check("str_replace applied", rd.data.content == "l0\nL1\nl2\nl3\n", repr(rd.data.content))
    try:
        client.file.str_replace_editor(command="str_replace", path=path, old_str="absent", new_str="x")
        check("str_replace missing old_str is an error", False, "no error raised")
    except ApiError as e:
        check("str_replace missing old_str is an error", 400 <= e.status_code < 500, repr(e))

    try:
        client.file.read_file(file=f"{root}/does-not-exist")
        check("read missing is 404", False, "no error raised")
    except ApiError as e:
        check("read missing is 404", e.status_code == 404, repr(e))

    blob = os.urandom(2 * 1024 * 1024 + 3) + b"\x00\xff\r\n"
    up = client.file.upload_file(file=("blob.bin", io.BytesIO(blob), "application/octet-stream"),
                                 path=f"{root}/up/blob.bin")
    check("upload", up.data.success and up.data.file_size == len(blob)
          and up.data.file_path == f"{root}/up/blob.bin", repr(up.data))
    got = b"".join(client.file.download_file(path=f"{root}/up/blob.bin"))
    check("download byte-exact", got == blob, f"{len(got)} vs {len(blob)} bytes")

    print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
