# Multi-stage build: compile in the Rust image, run on a small Debian base as
# a non-root user.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY bench ./bench
COPY migrations ./migrations
RUN cargo build --release --locked --bin sendonce --bin mock-provider

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home sendonce
COPY --from=build /src/target/release/sendonce /usr/local/bin/sendonce
COPY --from=build /src/target/release/mock-provider /usr/local/bin/mock-provider
USER sendonce
EXPOSE 8080
ENV SENDONCE_LISTEN=0.0.0.0:8080
ENTRYPOINT ["/usr/local/bin/sendonce"]
CMD ["serve"]
