#!/usr/bin/env bash
# Checks what the image needs to run alone, reading the Dockerfile and
# .dockerignore (Docker itself is not available here or in CI, as for
# scripts/check-compose.sh): a build context without build output, a
# non-root user with a writable working directory that the default SQLite
# file (sqlite://sendonce.db, relative) lands in, and a healthcheck on
# /healthz that needs no tool the image lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - <<'PY'
import re, sys
errors = []
def fail(msg):
    errors.append(msg); print("image:", msg)

# The build context: no target/ (gigabytes after a test run), no .git, no
# database files; nothing the Dockerfile copies is left out.
try:
    ignore = [l.strip() for l in open(".dockerignore") if l.strip() and not l.startswith("#")]
except FileNotFoundError:
    ignore = None
    fail("no .dockerignore: the build context takes target/ and .git")
docker = open("Dockerfile").read()
lines = [l.strip() for l in docker.replace("\\\n", " ").splitlines() if l.strip() and not l.strip().startswith("#")]
copied = [l.split()[1] for l in lines if l.startswith("COPY ") and "--from" not in l]
copied = [c for part in copied for c in [part]]
if ignore is not None:
    for must in ("target", ".git", "*.db"):
        if not any(p.strip("/") in (must, "**/" + must) for p in ignore):
            fail(f".dockerignore does not leave out {must}")
    for c in copied:
        for p in ignore:
            if p.strip("/") == c.strip("./").rstrip("/"):
                fail(f".dockerignore leaves out {c}, which the Dockerfile copies")

# The sendonce stage, with what it inherits from the stages it is built on.
stages, current = {}, None
for l in lines:
    m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", l, re.I)
    if m:
        current = m.group(2) or m.group(1)
        stages[current] = {"base": m.group(1), "lines": []}
    elif current:
        stages[current]["lines"].append(l)
def inherited(name):
    out = []
    while name in stages:
        out = stages[name]["lines"] + out
        name = stages[name]["base"]
    return out
final = list(stages)[-1]
if final != "sendonce":
    fail(f"the last (default) stage is {final}, not sendonce")
body = inherited("sendonce")
users = [l.split()[1] for l in body if l.upper().startswith("USER ")]
workdirs = [l.split()[1] for l in body if l.upper().startswith("WORKDIR ")]
if not users or users[-1] in ("root", "0"):
    fail("sendonce does not run as a non-root user")
if not workdirs:
    fail("sendonce has no WORKDIR: the default SQLite file (sqlite://sendonce.db) would go to / , not writable by its user")
else:
    wd, user = workdirs[-1], users[-1] if users else ""
    runs = " ".join(l for l in body if l.upper().startswith("RUN "))
    if not re.search(r"(mkdir|install)\b[^;&]*" + re.escape(wd), runs) or not re.search(r"chown\b[^;&]*" + re.escape(user) + r"[^;&]*" + re.escape(wd), runs):
        fail(f"WORKDIR {wd} is not made and given to {user} by a RUN")
default = re.search(r'url: "(sqlite://[^"]+)"', open("src/config/database.rs").read())
if not default or default.group(1).startswith("sqlite:///"):
    fail("the default database URL is not a relative sqlite:// path (it should land in WORKDIR)")
checks = [l for l in body if l.upper().startswith("HEALTHCHECK ")]
if not checks:
    fail("sendonce has no HEALTHCHECK")
elif "/healthz" not in checks[-1]:
    fail("the HEALTHCHECK does not ask /healthz")
elif re.search(r"\b(curl|wget)\b", checks[-1]) and not re.search(r"install[^;&]*\b(curl|wget)\b", " ".join(body)):
    fail("the HEALTHCHECK uses curl or wget, which the image does not install")
print("Dockerfile:", "not ready to run alone" if errors else "runs alone (writable data directory, SQLite default inside it, healthcheck)")
sys.exit(1 if errors else 0)
PY
