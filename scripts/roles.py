#!/usr/bin/env python3
"""The IAM roles of infra/template.yaml, as the tests use them: each function's policy
read from the template (never written out a second time), so that what the tests allow
is what a deployment allows.

  roles.py policies TEMPLATE RESOLVE
      Prints {function: policy document} for the four functions (named by the binary
      they run) and `gateway` (the Discord gateway's task role), every resource
      resolved with RESOLVE: a JSON object naming what the template's references stand
      for, e.g. {"Table.Arn": "arn:aws:dynamodb:...", "SecretsPath": "/pulse", ...}.

  roles.py moto-users TEMPLATE ENDPOINT RESOLVE
      On a moto server with no resources yet and authorisation off, switches
      authorisation on (POST /moto-api/reset-auth) after the three requests that create
      an administrator, then creates one IAM user per role with that role's resolved
      policy. Prints {"admin": keys, function: keys, ...}, keys being
      {"access_key_id": ..., "secret_access_key": ..., "environment": [...]}, the last
      the names of the variables the template sets for that function.

  roles.py check-actions TEMPLATE DIR
      The tally against the template, both ways: DIR holds what the functions' runs
      across the test suite sent, one file per function (`<function>.actions`, a line
      `<action>\\t<resource>` per distinct request, written when PULSE_AWS_ACTIONS_DIR
      is set). Fails if a function sent an action its role does not allow, or if its role
      allows an action no run sent (least privilege: an action nobody uses is one a
      compromised function could use). A function fed by a queue is also sent for by
      Lambda's event source mapping (EVENT_SOURCE_MAPPING below).

  roles.py --self-test TEMPLATE
      Checks that check-actions catches an action a role lacks and one no run used.
"""
import json
import os
import re
import sys
import tempfile
import urllib.request

os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from cfnlint.decode import decode  # noqa: E402

# The gateway's task role: `pulse gateway` runs in ECS with it.
GATEWAY = "gateway"

# What Lambda's event source mapping sends, with the function's own role, for a
# function an SQS queue feeds: it receives the batches, reads the queue's attributes and
# deletes the messages the function did not report failed. (The end-to-end test plays
# the mapping with the function's keys, so these are checked under IAM too.)
EVENT_SOURCE_MAPPING = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}


def fed_by_a_queue(sam):
    """The functions with an SQS event source."""
    return {
        r.get("Metadata", {}).get("BuildProperties", {}).get("Binary")
        for r in sam["Resources"].values()
        if r["Type"] == "AWS::Serverless::Function"
        and any(e.get("Type") == "SQS" for e in r["Properties"].get("Events", {}).values())
    }


def roles(sam):
    """{function: [statement]} as the template writes them (intrinsics unresolved)."""
    out = {}
    for r in sam["Resources"].values():
        if r["Type"] == "AWS::Serverless::Function":
            binary = r.get("Metadata", {}).get("BuildProperties", {}).get("Binary")
            statements = [
                st for pol in r["Properties"].get("Policies", []) if isinstance(pol, dict) for st in pol.get("Statement", [])
            ]
            out[binary] = statements
    task_role = sam["Resources"].get("GatewayTaskRole")
    if task_role:
        out[GATEWAY] = [
            st for pol in task_role["Properties"].get("Policies", []) for st in pol["PolicyDocument"]["Statement"]
        ]
    return out


def environments(sam):
    """{function: [the names of the variables the template sets for it]} (Globals and its
    own), so a test gives each function what a deployment gives it, and no more."""
    common = sam.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {})
    out = {}
    for r in sam["Resources"].values():
        if r["Type"] == "AWS::Serverless::Function":
            binary = r.get("Metadata", {}).get("BuildProperties", {}).get("Binary")
            own = r["Properties"].get("Environment", {}).get("Variables", {})
            out[binary] = sorted(set(common) | set(own))
    task = sam["Resources"].get("GatewayTaskDefinition")
    if task:
        out[GATEWAY] = sorted(
            {e["Name"] for c in task["Properties"]["ContainerDefinitions"] for e in c.get("Environment", [])}
            | {e["Name"] for c in task["Properties"]["ContainerDefinitions"] for e in c.get("Secrets", [])}
        )
    return out


def _resolve(value, names):
    """A template value with its references replaced from `names`."""
    if isinstance(value, list):
        return [_resolve(v, names) for v in value]
    if isinstance(value, dict):
        if "Fn::GetAtt" in value:
            g = value["Fn::GetAtt"]
            key = ".".join(g) if isinstance(g, list) else g
            return _lookup(key, names)
        if "Ref" in value:
            return _lookup(value["Ref"], names)
        if "Fn::Sub" in value:
            return re.sub(r"\$\{([^}]+)\}", lambda m: _lookup(m.group(1), names), value["Fn::Sub"])
        raise SystemExit(f"cannot resolve {value} (only !GetAtt, !Ref and !Sub are read)")
    return value


def _lookup(key, names):
    if key not in names:
        raise SystemExit(f"the template refers to {key}, which the resolve map does not name (it names {sorted(names)})")
    return names[key]


def policies(sam, names):
    out = {}
    for function, statements in roles(sam).items():
        resolved = []
        for st in statements:
            st = dict(st)
            st.pop("Sid", None)
            st["Resource"] = _resolve(st["Resource"], names)
            resolved.append(st)
        out[function] = {"Version": "2012-10-17", "Statement": resolved}
    return out


def _moto_users(sam, endpoint, names):
    import boto3

    def iam(keys):
        return boto3.client(
            "iam",
            endpoint_url=endpoint,
            region_name=os.environ["AWS_DEFAULT_REGION"],
            aws_access_key_id=keys["access_key_id"],
            aws_secret_access_key=keys["secret_access_key"],
        )

    def user(client, name, policy):
        client.create_user(UserName=name)
        client.put_user_policy(UserName=name, PolicyName="role", PolicyDocument=json.dumps(policy))
        k = client.create_access_key(UserName=name)["AccessKey"]
        return {"access_key_id": k["AccessKeyId"], "secret_access_key": k["SecretAccessKey"]}

    # The next three requests pass unchecked; every later one is authorised.
    reset = urllib.request.Request(
        endpoint + "/moto-api/reset-auth", data=b"3", method="POST", headers={"Content-Type": "text/plain"}
    )
    urllib.request.urlopen(reset).read()
    # Users are named `<function>@<run>`: a second run on the same server makes its own.
    run = os.urandom(4).hex()
    admin = user(
        iam({"access_key_id": "bootstrap", "secret_access_key": "bootstrap"}),
        f"admin@{run}",
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]},
    )
    out = {"admin": admin}
    client = iam(admin)
    env = environments(sam)
    for function, policy in policies(sam, names).items():
        out[function] = user(client, f"{function}@{run}", policy)
        out[function]["environment"] = env.get(function, [])
    return out


def _matches(pattern, value):
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), value) is not None


def allowed_actions(statements):
    out = set()
    for st in statements:
        a = st["Action"]
        out.update(a if isinstance(a, list) else [a])
    return out


def check_actions(sam, directory):
    """Sentences: what a function sent that its role lacks, and what its role allows that
    no run sent."""
    found = []
    sent_by = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".actions"):
            with open(os.path.join(directory, name)) as f:
                sent_by[name[: -len(".actions")]] = {line.split("\t")[0] for line in f if line.strip()}
    queued = fed_by_a_queue(sam)
    for function, statements in sorted(roles(sam).items()):
        allowed = allowed_actions(statements)
        sent = sent_by.get(function)
        if sent is None:
            found.append(f"{function}: no run of it recorded what it sent (no {function}.actions in {directory})")
            continue
        if function in queued:
            sent = sent | EVENT_SOURCE_MAPPING
        for action in sorted(sent):
            if not any(_matches(a, action) for a in allowed):
                found.append(f"{function}: sent {action}, which its role does not allow (a deployment refuses it)")
        for action in sorted(allowed):
            if not any(_matches(action, s) for s in sent):
                found.append(f"{function}: its role allows {action}, which no run sent (drop it, or test the path that needs it)")
    for function in sorted(set(sent_by) - set(roles(sam))):
        found.append(f"{function}: recorded what it sent, but the template gives it no role")
    return found


def self_test(sam):
    """Breakages check_actions must catch, by name, that it missed."""
    missed = []
    with tempfile.TemporaryDirectory() as d:
        for function, statements in roles(sam).items():
            with open(os.path.join(d, function + ".actions"), "w") as f:
                for action in sorted(allowed_actions(statements)):
                    f.write(f"{action}\t*\n")
        if check_actions(sam, d):
            missed.append("a tally that uses exactly what each role allows was refused")
        with open(os.path.join(d, "webhook-receiver.actions"), "a") as f:
            f.write("dynamodb:DeleteItem\t*\n")
        if not any("sent dynamodb:DeleteItem" in p for p in check_actions(sam, d)):
            missed.append("an action the receiver's role lacks")
        with open(os.path.join(d, "webhook-receiver.actions"), "w") as f:
            f.write("dynamodb:GetItem\t*\n")
        if not any("webhook-receiver: its role allows" in p for p in check_actions(sam, d)):
            missed.append("actions the receiver's role allows that no run sent")
    return missed


def main(argv):
    if len(argv) >= 2 and argv[0] == "--self-test":
        sam = _load(argv[1])
        missed = self_test(sam)
        if missed:
            print(f"roles.py check-actions missed: {', '.join(missed)}", file=sys.stderr)
            return 1
        print("roles.py check-actions: every breakage of the self-test was caught")
        return 0
    if len(argv) == 3 and argv[0] == "policies":
        print(json.dumps(policies(_load(argv[1]), json.loads(argv[2])), indent=1))
        return 0
    if len(argv) == 4 and argv[0] == "moto-users":
        print(json.dumps(_moto_users(_load(argv[1]), argv[2], json.loads(argv[3]))))
        return 0
    if len(argv) == 3 and argv[0] == "check-actions":
        found = check_actions(_load(argv[1]), argv[2])
        for f in found:
            print(f"{argv[1]}: {f}", file=sys.stderr)
        if found:
            return 1
        print(f"{argv[1]}: every action each function sent is in its role, and each role allows nothing no run sent: ok")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


def _load(path):
    sam, errors = decode(path)
    if errors:
        raise SystemExit(f"{path}: cannot be read: {errors}")
    return sam


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
