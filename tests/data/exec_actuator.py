"""A stand-in for a user's Slurm script, driven by `homing.scaler.actuators.exec`.

Usage: `exec_actuator.py scale N` or `exec_actuator.py list`. State lives in the directory
`$EXEC_STATE`: `members.json` ([[id, url or "-"], ...]), `pool` (worker URLs the test
started, one a line, handed to members in order; a member gets "-" while none is free),
`calls` (one line per call: its arguments and `HOMING_STOP`), and optional `fail` (its text:
the verb that fails, e.g. "scale"; the script then prints "boom <verb>" on stderr and exits
4) and `garbage` (the verb whose output is a malformed line).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    state = Path(os.environ["EXEC_STATE"])
    verb = sys.argv[1]
    with (state / "calls").open("a") as f:
        f.write(" ".join([*sys.argv[1:], f"stop={os.environ.get('HOMING_STOP', '')}"]) + "\n")
    fail = state / "fail"
    if fail.exists() and fail.read_text().strip() == verb:
        print("working on it", file=sys.stderr)
        print(f"boom {verb}", file=sys.stderr)
        return 4
    path = state / "members.json"
    members: list[list[str]] = json.loads(path.read_text()) if path.exists() else []
    counter = state / "counter"
    if verb == "scale":
        target = int(sys.argv[2])
        stop = [m for m in os.environ.get("HOMING_STOP", "").split(",") if m]
        members = [m for m in members if m[0] not in stop]
        while len(members) > target:
            members.pop()
        while len(members) < target:
            n = int(counter.read_text()) if counter.exists() else 0
            counter.write_text(str(n + 1))
            members.append([f"job-{n}", "-"])
    pool_file = state / "pool"
    pool = pool_file.read_text().split() if pool_file.exists() else []
    taken = {m[1] for m in members}
    free = [url for url in pool if url not in taken]
    for m in members:
        if m[1] == "-" and free:
            m[1] = free.pop(0)
    path.write_text(json.dumps(members))
    garbage = state / "garbage"
    if garbage.exists() and garbage.read_text().strip() == verb:
        print("job-x grpc://nowhere extra")
        return 0
    for member_id, url in members:
        print(member_id, url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
