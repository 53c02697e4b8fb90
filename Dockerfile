# Multi-stage build: compile in the Rust image, run on a small Debian base as
# a non-root user. The default (last) stage ships the `sendonce` binary alone;
# the test tooling (the `testkit` crate's mock provider) is built only for the
# `mock-provider` stage, which docker-compose.yml's demo stack asks for.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY bench ./bench
COPY testkit ./testkit
COPY migrations ./migrations
RUN cargo build --release --locked -p sendonce --bin sendonce

FROM build AS build-mock
RUN cargo build --release --locked -p testkit --bin mock-provider

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home sendonce \
    && mkdir -p /var/lib/sendonce \
    && chown sendonce:sendonce /var/lib/sendonce
# The working directory is the data directory: the default database,
# sqlite://sendonce.db, is created here (mount a volume on it to keep it).
WORKDIR /var/lib/sendonce
USER sendonce

# The demo's stand-in SMS provider (docker compose builds it with
# `target: mock-provider`); never part of the sendonce image.
FROM runtime AS mock-provider
COPY --from=build-mock /src/target/release/mock-provider /usr/local/bin/mock-provider
EXPOSE 9090
ENV MOCK_LISTEN=0.0.0.0:9090
ENTRYPOINT ["/usr/local/bin/mock-provider"]

FROM runtime AS sendonce
COPY --from=build /src/target/release/sendonce /usr/local/bin/sendonce
EXPOSE 8080
ENV SENDONCE_LISTEN=0.0.0.0:8080
# `GET /healthz` over bash's /dev/tcp (the image has no curl or wget), on
# the default port: change it here if SENDONCE_LISTEN names another.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["/usr/local/bin/sendonce"]
CMD ["serve"]
