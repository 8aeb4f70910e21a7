# Caddy with Tollgate, built the way Caddy's official images document:
# xcaddy in the caddy:builder image, the binary copied into caddy.
#
#   docker build -t caddy-tollgate .
#   docker build --build-arg TOLLGATE_VERSION=v0.3.0 -t caddy-tollgate .
#
# CADDY_VERSION pins Caddy (Tollgate supports v2.11.x); TOLLGATE_VERSION
# pins the module. With TOLLGATE_VERSION=local the module is built from
# this checkout instead (the build context).
ARG CADDY_VERSION=2.11.9

FROM caddy:${CADDY_VERSION}-builder AS builder
ARG CADDY_VERSION
ARG TOLLGATE_VERSION=local
COPY . /src/tollgate
RUN if [ "$TOLLGATE_VERSION" = "local" ]; then \
		xcaddy build "v${CADDY_VERSION}" --with github.com/tollgate/caddy-tollgate=/src/tollgate; \
	else \
		xcaddy build "v${CADDY_VERSION}" --with "github.com/tollgate/caddy-tollgate@${TOLLGATE_VERSION}"; \
	fi

FROM caddy:${CADDY_VERSION}
COPY --from=builder /usr/bin/caddy /usr/bin/caddy
