# Runs schemathesis over Docker's Engine API spec (argv[1]) with the rest of argv passed to `schemathesis run`,
# after adding to the spec the status codes the engine answers but the spec leaves out (each with its reason),
# so that status_code_conformance checks what the engine does rather than the spec's omissions.
import json
import os
import subprocess
import sys
import tempfile

import yaml

ERROR = {"schema": {"$ref": "#/definitions/ErrorResponse"}}

# (path, method) or (path, "*") -> {code: reason}
OMITTED = {
    # The engine answers 400 (errdefs.InvalidParameter) to any invalid query parameter or body on any
    # endpoint: a malformed `filters`, an unknown filter, a bad `version`, JSON that does not decode.
    ("*", "*"): {"400": "invalid parameter or body"},
    # A stale `version`: Shoal answers 409 Conflict (compare-and-swap on the object's version).
    ("/services/{id}/update", "post"): {"409": "update out of sequence"},
    ("/nodes/{id}/update", "post"): {"409": "update out of sequence"},
    ("/swarm/update", "post"): {"409": "update out of sequence"},
    ("/secrets/{id}/update", "post"): {"409": "update out of sequence"},
    ("/configs/{id}/update", "post"): {"409": "update out of sequence"},
    # A network name taken: 409, as the engine answers (moby's errdefs.Conflict for a duplicate name).
    ("/networks/create", "post"): {"409": "network name in use"},
    # Removing a secret or config a service uses is an InvalidArgument from SwarmKit: 400 (covered above).
    # The engine's notLockedError is a Conflict.
    ("/swarm/unlock", "post"): {"409": "swarm is not locked"},
}

# Answers whose shape the engine has differently from the spec: POST /secrets/create and /configs/create
# answer {"ID": ...} (the engine's SecretCreateResponse / ConfigCreateResponse, which the docker CLI and the
# Python SDK read), not the spec's IdResponse {"Id": ...}.
CREATED_ID = {"type": "object", "required": ["ID"], "properties": {"ID": {"type": "string"}}}
RESHAPED = {("/secrets/create", "post", 201): CREATED_ID, ("/configs/create", "post", 201): CREATED_ID}

spec_path, args = sys.argv[1], sys.argv[2:]
with open(spec_path) as f:
    spec = yaml.safe_load(f)
for (path, method, code), schema in RESHAPED.items():
    spec["paths"][path][method]["responses"][code]["schema"] = schema
for path, ops in spec["paths"].items():
    for method, op in ops.items():
        if not isinstance(op, dict) or "responses" not in op:
            continue
        for (p, m), codes in OMITTED.items():
            if p in ("*", path) and m in ("*", method):
                for code, reason in codes.items():
                    op["responses"].setdefault(code, dict(ERROR, description=f"{reason} (answered by the engine, left out of the spec)"))

# In a scratch directory, removed after: the patched spec, and the caches schemathesis and hypothesis leave in
# their working directory.
with tempfile.TemporaryDirectory(prefix="shoal-schemathesis-") as workdir:
    patched = os.path.join(workdir, "engine-api.json")
    with open(patched, "w") as out:
        json.dump(spec, out)
    schemathesis = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    code = subprocess.call([schemathesis, "run", patched, "--generation-database", "none", *args], cwd=workdir)
sys.exit(code)
