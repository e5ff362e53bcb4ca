# kvgate container image: a static binary on a distroless base, running as a non-root user.
#
#   docker build -t kvgate:dev .
#   docker build --build-arg VERSION=v0.1.0 -t ghcr.io/kvgate/kvgate:v0.1.0 .   # a release: `kvgate version` names it
#   docker run --rm -p 30000:30000 -p 29000:29000 kvgate:dev   # simulated workers, as `go run ./cmd/kvgate`
#
# Stage 1 builds with the Go toolchain; CGO is off, so the binary needs no libc.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/kvgate ./cmd/kvgate

# Stage 2 holds the binary, CA certificates and /etc/passwd for user 65532 ("nonroot"); no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kvgate /usr/local/bin/kvgate
USER 65532:65532
# API, admin (loopback unless an admin key is set), Prometheus metrics.
EXPOSE 30000 30001 29000
ENTRYPOINT ["/usr/local/bin/kvgate"]
