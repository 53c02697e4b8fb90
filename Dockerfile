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
COPY vendor ./vendor
RUN cargo build --release --locked -p sendonce --bin sendonce

FROM build AS build-mock
RUN cargo build --release --locked -p testkit --bin mock-provider

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home sendonce
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
ENTRYPOINT ["/usr/local/bin/sendonce"]
CMD ["serve"]
