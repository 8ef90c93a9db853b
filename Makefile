# The README's commands. `make run` and `make test` install what they need first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
APT_PACKAGES := s3fs rclone wrk fuse3 nginx

.PHONY: install run test bench system-deps clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/orgmem serve

# Debian packages the client tests drive (s3fs-fuse, rclone), the benchmark uses (wrk) and the
# local cluster puts in front of the gateways (nginx).
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

test: $(STAMP) system-deps
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)

# Both benchmarks. BENCH_ARGS goes to s3_bench.py; seal_bench.py gets SEAL_BENCH_ARGS
# (by default only the --quick of BENCH_ARGS).
SEAL_BENCH_ARGS ?= $(filter --quick,$(BENCH_ARGS))
bench: $(STAMP) system-deps
	$(PY) bench/s3_bench.py $(BENCH_ARGS)
	$(PY) bench/seal_bench.py $(SEAL_BENCH_ARGS)
	$(PY) bench/bio_bench.py $(filter --quick,$(BENCH_ARGS))
	$(PY) bench/search_bench.py $(filter --quick,$(BENCH_ARGS))
	$(PY) bench/cluster_bench.py $(filter --quick,$(BENCH_ARGS))

clean:
	rm -rf $(VENV) orgmem-data
