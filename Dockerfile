# The image of `pulse gateway`, the Discord gateway's forwarder (ECS Fargate with the
# template's GatewayImage parameter, or any machine with Docker). The same binary is the
# whole CLI. Built for the machine it runs on; for Fargate's ARM64:
#   docker buildx build --platform linux/arm64 -t pulse .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p pulse-cli

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/pulse /usr/local/bin/pulse
# Nothing to write: the state is in DynamoDB, the configuration in the environment.
USER 65534:65534
ENTRYPOINT ["pulse"]
CMD ["gateway"]
