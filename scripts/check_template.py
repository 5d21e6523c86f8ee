#!/usr/bin/env python3
"""Checks infra/template.yaml for what a deployment relies on, on the template as
CloudFormation will see it (after the SAM transform):

- every SQS event source: the queue's visibility timeout is >= 6x the function's timeout
  (Lambda's advice: a message stays hidden while a batch and its retries run), the queue
  has a redrive policy to a DLQ that exists, ReportBatchItemFailures is on;
- the sessions worker's event source has a maximum concurrency;
- every function: provided.al2023, arm64, BuildMethod rust-cargolambda;
- the sweeper: a rate(1 minute) schedule and a daily retention schedule (`detail-type`
  `Pulse Retention`), each with a retry policy and a DLQ;
- the receiver: a Function URL with auth NONE;
- no secret is a template parameter (they come from SSM);
- the functions that read stored secrets (the receiver: webhook secrets; the dispatcher:
  hook secrets) read PULSE_ENCRYPTION_KEY from SSM: PULSE_SECRETS_PATH is set and they
  may call ssm:GetParametersByPath;
- every DLQ has an alarm on its depth and every function an alarm on its errors;
- the Discord gateway: an optional (condition WithGateway) ECS Fargate task running
  `pulse gateway` from the image the repository's Dockerfile builds, its bot token from
  SSM (never in its environment), its log in CloudWatch, its role limited to what it
  sends (the table's items it reads and writes, the sessions queue);
- alarms on the functions' own metrics (EMF): heartbeat lateness, the heartbeat failure
  rate and hook dead letters, each on a metric shared/src/meter.rs names, in the
  namespace the functions are given (PULSE_METRICS_NAMESPACE), with a `function`
  dimension shared/src/lambda.rs names.

`--self-test` breaks a copy of the template in each of those ways and fails unless the
check catches every one.

Usage: check_template.py [--self-test] [infra/template.yaml]
"""
import copy
import logging
import os
import re
import sys

os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
logging.getLogger("samtranslator").setLevel(logging.ERROR)

from cfnlint.decode import decode  # noqa: E402
from samtranslator.translator.transform import transform  # noqa: E402


class _NoManagedPolicies:
    def load(self):
        return {}


def _ref(v):
    """The logical id a !Ref or !GetAtt points at, else None."""
    if isinstance(v, dict):
        if "Ref" in v:
            return v["Ref"]
        if "Fn::GetAtt" in v:
            g = v["Fn::GetAtt"]
            return g[0] if isinstance(g, list) else g.split(".")[0]
    return None


def problems(sam):
    """What is wrong with the (untransformed) SAM template `sam`, as sentences."""
    found = []
    sam = copy.deepcopy(sam)
    for r in sam["Resources"].values():
        if r["Type"] == "AWS::Serverless::Function":
            r["Metadata"] = r.get("Metadata", {})
    functions = {k: r for k, r in sam["Resources"].items() if r["Type"] == "AWS::Serverless::Function"}
    for name, fn in functions.items():
        meta = fn.get("Metadata", {})
        if meta.get("BuildMethod") != "rust-cargolambda":
            found.append(f"{name}: Metadata.BuildMethod is not rust-cargolambda")
    for name in ("WebhookReceiverFunction", "HookDispatcherFunction"):
        fn = functions.get(name, {})
        env = fn.get("Properties", {}).get("Environment", {}).get("Variables", {})
        actions = [
            a
            for pol in fn.get("Properties", {}).get("Policies", [])
            if isinstance(pol, dict)
            for st in pol.get("Statement", [])
            for a in (st.get("Action") if isinstance(st.get("Action"), list) else [st.get("Action")])
        ]
        if "PULSE_SECRETS_PATH" not in env or "ssm:GetParametersByPath" not in actions:
            found.append(f"{name}: cannot read PULSE_ENCRYPTION_KEY from SSM (PULSE_SECRETS_PATH and ssm:GetParametersByPath)")
    for p, spec in sam.get("Parameters", {}).items():
        if spec.get("NoEcho") or re.search(r"(Token|ApiKey|Secret|Password|PrivateKey)$", p):
            found.append(f"parameter {p} looks like a secret: secrets come from SSM (SecretsPath)")

    built = copy.deepcopy(sam)
    for r in built["Resources"].values():
        if r["Type"] == "AWS::Serverless::Function":
            r["Properties"]["CodeUri"] = "s3://bucket/key"
    cfn = transform(built, {}, _NoManagedPolicies())
    res = cfn["Resources"]
    glob = sam.get("Globals", {}).get("Function", {})

    lambdas = {k: r for k, r in res.items() if r["Type"] == "AWS::Lambda::Function"}
    for name, fn in lambdas.items():
        props = fn["Properties"]
        if props.get("Runtime", glob.get("Runtime")) != "provided.al2023":
            found.append(f"{name}: runtime is not provided.al2023")
        if props.get("Architectures", glob.get("Architectures")) != ["arm64"]:
            found.append(f"{name}: architecture is not arm64")

    queues = {k: r for k, r in res.items() if r["Type"] == "AWS::SQS::Queue"}
    for k, m in res.items():
        if m["Type"] != "AWS::Lambda::EventSourceMapping":
            continue
        p = m["Properties"]
        q = _ref(p["EventSourceArn"])
        fn = _ref(p["FunctionName"])
        timeout = lambdas[fn]["Properties"].get("Timeout", 3)
        vis = queues[q]["Properties"].get("VisibilityTimeout", 30)
        if vis < 6 * timeout:
            found.append(f"{q}: visibility timeout {vis} s is under 6 x {fn}'s timeout {timeout} s")
        redrive = queues[q]["Properties"].get("RedrivePolicy")
        if not redrive or _ref(redrive.get("deadLetterTargetArn")) not in queues:
            found.append(f"{q}: no redrive policy to a dead-letter queue")
        if "ReportBatchItemFailures" not in p.get("FunctionResponseTypes", []):
            found.append(f"{k}: ReportBatchItemFailures is off")
        if queues[q]["Properties"].get("FifoQueue") and not p.get("ScalingConfig", {}).get("MaximumConcurrency"):
            found.append(f"{k}: the sessions worker has no maximum concurrency")
    if not any(r["Type"] == "AWS::Lambda::EventSourceMapping" for r in res.values()):
        found.append("no SQS event sources")

    schedules = [r for r in res.values() if r["Type"] == "AWS::Scheduler::Schedule"]
    if not schedules:
        found.append("no EventBridge Scheduler schedule for the sweeper")
    kinds = {}
    for s in schedules:
        p = s["Properties"]
        t = p["Target"]
        kind = "retention" if '"detail-type":"Pulse Retention"' in t.get("Input", "") else "sweep"
        kinds[kind] = p.get("ScheduleExpression")
        if "RetryPolicy" not in t:
            found.append(f"the {kind} schedule has no retry policy")
        if _ref(t.get("DeadLetterConfig", {}).get("Arn")) not in queues:
            found.append(f"the {kind} schedule has no dead-letter queue")
    if kinds.get("sweep") != "rate(1 minute)":
        found.append("the sweep schedule is not rate(1 minute)")
    if kinds.get("retention") != "rate(1 day)":
        found.append("no daily retention schedule (detail-type Pulse Retention, rate(1 day))")

    urls = [r for r in res.values() if r["Type"] == "AWS::Lambda::Url"]
    if len(urls) != 1 or urls[0]["Properties"].get("AuthType") != "NONE":
        found.append("the receiver has no Function URL with auth NONE")

    alarms = [r["Properties"] for r in res.values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    watched = {_ref(d.get("Value")) for a in alarms for d in a.get("Dimensions", [])}
    dlqs = {_ref(q["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]) for q in queues.values() if "RedrivePolicy" in q["Properties"]}
    for s in schedules:
        dlqs.add(_ref(s["Properties"]["Target"].get("DeadLetterConfig", {}).get("Arn")))
    for d in sorted(x for x in dlqs if x):
        if d not in watched:
            found.append(f"{d}: no alarm on its depth")
    for fn in sorted(lambdas):
        if fn not in watched:
            found.append(f"{fn}: no alarm on its errors")
    found.extend(_metric_alarms(res, lambdas))
    found.extend(_gateway(sam))
    return found


# What `pulse gateway` calls: the CLI's start-up check (DescribeTable, GetQueueAttributes),
# agents and channels read, events, interactions and the lease written, messages sent.
GATEWAY_ACTIONS = {
    "dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
    "dynamodb:Query", "sqs:GetQueueAttributes", "sqs:SendMessage",
}


def _actions(statements):
    for st in statements:
        a = st.get("Action")
        yield from (a if isinstance(a, list) else [a])


def _gateway(sam):
    """The optional gateway task: what `pulse gateway` needs and no more."""
    found = []
    res = sam["Resources"]
    tasks = {k: r for k, r in res.items() if r["Type"] == "AWS::ECS::TaskDefinition"}
    if not tasks:
        return ["no ECS task definition for the Discord gateway (pulse gateway)"]
    for k, r in res.items():
        if (r["Type"].startswith("AWS::ECS::") or k.startswith("Gateway")) and r.get("Condition") != "WithGateway":
            found.append(f"{k}: the gateway is optional, but this has no WithGateway condition")
    for k, t in tasks.items():
        p = t["Properties"]
        if p.get("RequiresCompatibilities") != ["FARGATE"]:
            found.append(f"{k}: not a Fargate task")
        for c in p.get("ContainerDefinitions", []):
            if c.get("Command") != ["gateway"]:
                found.append(f"{k}: the container does not run `pulse gateway`")
            env = {e["Name"] for e in c.get("Environment", [])}
            secrets = {e["Name"]: e.get("ValueFrom") for e in c.get("Secrets", [])}
            if "DISCORD_BOT_TOKEN" in env or "DISCORD_BOT_TOKEN" not in secrets or "SecretsPath" not in str(secrets.get("DISCORD_BOT_TOKEN")):
                found.append(f"{k}: DISCORD_BOT_TOKEN must come from SSM under SecretsPath, not the environment")
            if c.get("LogConfiguration", {}).get("LogDriver") != "awslogs":
                found.append(f"{k}: the gateway's log does not go to CloudWatch")
        role = res.get(_ref(p.get("TaskRoleArn")) or "", {})
        granted = {a for pol in role.get("Properties", {}).get("Policies", []) for a in _actions(pol["PolicyDocument"]["Statement"])}
        if not granted or not granted <= GATEWAY_ACTIONS:
            found.append(f"{k}: the task role may do {sorted(granted - GATEWAY_ACTIONS) or 'nothing'}; the gateway needs {sorted(GATEWAY_ACTIONS)} only")
    dockerfile = os.path.join(os.path.dirname(__file__), "..", "Dockerfile")
    if not os.path.exists(dockerfile) or 'ENTRYPOINT ["pulse"]' not in _source("Dockerfile"):
        found.append("no Dockerfile with ENTRYPOINT [\"pulse\"] for the gateway's image")
    return found


def _source(*parts):
    with open(os.path.join(os.path.dirname(__file__), "..", *parts)) as f:
        return f.read()


def _metric_alarms(res, lambdas):
    """The alarms on Pulse's own metrics watch names the code records, where it records them."""
    found = []
    names = set(re.findall(r'pub const \w+: &str = "(pulse_\w+)";', _source("shared", "src", "meter.rs")))
    lambda_rs = _source("shared", "src", "lambda.rs")
    block = lambda_rs[lambda_rs.index("pub mod function"):]
    functions = set(re.findall(r'pub const \w+: &str = "(\w+)";', block[: block.index("\n}")]))
    spaces = {repr(fn["Properties"].get("Environment", {}).get("Variables", {}).get("PULSE_METRICS_NAMESPACE")) for fn in lambdas.values()}
    if len(spaces) != 1 or spaces == {"None"}:
        found.append("the functions do not all have one PULSE_METRICS_NAMESPACE")
    watched = set()
    for name, r in res.items():
        if r["Type"] != "AWS::CloudWatch::Alarm":
            continue
        p = r["Properties"]
        stats = [m["MetricStat"]["Metric"] for m in p.get("Metrics", []) if "MetricStat" in m]
        if "MetricName" in p:
            stats.append(p)
        for m in stats:
            ns = m.get("Namespace")
            if isinstance(ns, str) and ns.startswith("AWS/"):
                continue
            dims = {d["Name"]: d["Value"] for d in m.get("Dimensions", [])}
            if repr(ns) not in spaces:
                found.append(f"{name}: namespace {ns} is not the functions' PULSE_METRICS_NAMESPACE")
            if m.get("MetricName") not in names:
                found.append(f"{name}: {m.get('MetricName')} is not a metric shared/src/meter.rs records")
            if dims.get("function") not in functions:
                found.append(f"{name}: function dimension {dims.get('function')} is not one shared/src/lambda.rs gives")
            watched.add((m.get("MetricName"), dims.get("outcome")))
    for metric, outcome, what in [
        ("pulse_heartbeat_lateness_max_seconds", None, "heartbeat lateness"),
        ("pulse_heartbeats_total", "failed", "the heartbeat failure rate"),
        ("pulse_hook_deliveries_total", "dead_lettered", "hook dead letters"),
    ]:
        if (metric, outcome) not in watched:
            found.append(f"no alarm on {what} ({metric})")
    return found


def self_test(sam):
    """Each way of breaking the template must be caught."""
    def fn(t, name):
        return t["Resources"][name]

    breakages = {
        "visibility under 6x": lambda t: fn(t, "SessionsQueue")["Properties"].update(VisibilityTimeout=60),
        "no redrive": lambda t: fn(t, "HooksQueue")["Properties"].pop("RedrivePolicy"),
        "partial failures off": lambda t: fn(t, "HookDispatcherFunction")["Properties"]["Events"]["Hooks"]["Properties"].pop("FunctionResponseTypes"),
        "no max concurrency": lambda t: fn(t, "ConversationWorkerFunction")["Properties"]["Events"]["Sessions"]["Properties"].pop("ScalingConfig"),
        "x86": lambda t: fn(t, "HookDispatcherFunction")["Properties"].update(Architectures=["x86_64"]),
        "no cargo-lambda": lambda t: fn(t, "WebhookReceiverFunction")["Metadata"].pop("BuildMethod"),
        "secret parameter": lambda t: t["Parameters"].update(DiscordBotToken={"Type": "String", "NoEcho": True}),
        "schedule without DLQ": lambda t: fn(t, "HeartbeatSweeperFunction")["Properties"]["Events"]["EveryMinute"]["Properties"].pop("DeadLetterConfig"),
        "no retention schedule": lambda t: fn(t, "HeartbeatSweeperFunction")["Properties"]["Events"].pop("Daily"),
        "url with IAM auth": lambda t: fn(t, "WebhookReceiverFunction")["Properties"]["FunctionUrlConfig"].update(AuthType="AWS_IAM"),
        "DLQ without alarm": lambda t: t["Resources"].pop("HooksDeadLetterAlarm"),
        "function without alarm": lambda t: t["Resources"].pop("HookDispatcherErrorsAlarm"),
        "no lateness alarm": lambda t: t["Resources"].pop("HeartbeatLatenessAlarm"),
        "alarm on a metric nothing records": lambda t: fn(t, "HookDeadLettersAlarm")["Properties"].update(MetricName="pulse_hook_dead_letters"),
        "alarm in another namespace": lambda t: fn(t, "HeartbeatLatenessAlarm")["Properties"].update(Namespace="Pulse"),
        "alarm on a function that is not one": lambda t: fn(t, "HookDeadLettersAlarm")["Properties"]["Dimensions"][0].update(Value="hook-dispatcher"),
        "dispatcher without the encryption key": lambda t: fn(t, "HookDispatcherFunction")["Properties"]["Environment"]["Variables"].pop("PULSE_SECRETS_PATH"),
        "gateway token in its environment": lambda t: fn(t, "GatewayTaskDefinition")["Properties"]["ContainerDefinitions"][0]["Environment"].append({"Name": "DISCORD_BOT_TOKEN", "Value": "x"}),
        "gateway role beyond what it sends": lambda t: fn(t, "GatewayTaskRole")["Properties"]["Policies"][0]["PolicyDocument"]["Statement"][0]["Action"].append("dynamodb:DeleteItem"),
        "gateway not optional": lambda t: fn(t, "GatewayService").pop("Condition"),
        "no gateway": lambda t: t["Resources"].pop("GatewayTaskDefinition"),
    }
    missed = []
    for what, brk in breakages.items():
        t = copy.deepcopy(sam)
        brk(t)
        if not problems(t):
            missed.append(what)
    return missed


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    path = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "infra", "template.yaml")
    sam, errors = decode(path)
    if errors:
        print(f"{path}: cannot be read: {errors}", file=sys.stderr)
        return 1
    found = problems(sam)
    for f in found:
        print(f"{path}: {f}", file=sys.stderr)
    if found:
        return 1
    if "--self-test" in argv:
        missed = self_test(sam)
        if missed:
            print(f"the check missed these breakages: {', '.join(missed)}", file=sys.stderr)
            return 1
        print("template check: every breakage of the self-test was caught")
    print(f"{path}: visibility >= 6x timeouts, a daily retention pass, DLQs with alarms, alarms on lateness, failures and dead letters, ReportBatchItemFailures, arm64 cargo-lambda builds, secrets from SSM, an optional gateway task with the least it needs: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
