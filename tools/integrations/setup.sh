#!/usr/bin/env bash
# Install the pinned vLLM and SGLang (CPU use) in venvs OUTSIDE the repository, and
# fetch vLLM's sdist (its tests/ are not in the wheel).  Idempotent: a venv that
# already has the pinned version is left alone.
#
#   tools/integrations/setup.sh [vllm|sglang|all]     (default: all)
#
# Environment: KVT_VENV_VLLM (default /work/venv-vllm), KVT_VENV_SGLANG
# (default /work/venv-sglang), KVT_VLLM_SRC (default /work/vllm-src: the
# unpacked sdist's tests), KVT_HF_HOME (default /work/hf-home: a local Hugging Face cache
# holding facebook/opt-125m's config.json), PYTHON (default python3).
set -euo pipefail
VLLM_PIN=0.33.0
SGLANG_PIN=0.5.23
VENV_VLLM=${KVT_VENV_VLLM:-/work/venv-vllm}
VENV_SGLANG=${KVT_VENV_SGLANG:-/work/venv-sglang}
VLLM_SRC=${KVT_VLLM_SRC:-/work/vllm-src}
HF=${KVT_HF_HOME:-/work/hf-home}
PY=${PYTHON:-python3}
what=${1:-all}

have() { # venv package version
	[ -x "$1/bin/python" ] &&
		[ "$("$1/bin/python" -c "import importlib.metadata as m; print(m.version('$2'))" 2>/dev/null)" = "$3" ]
}

setup_vllm() {
	if have "$VENV_VLLM" vllm "$VLLM_PIN"; then
		echo "setup: vllm $VLLM_PIN already in $VENV_VLLM"
	else
		"$PY" -m venv "$VENV_VLLM"
		"$VENV_VLLM/bin/pip" install -q --upgrade pip
		"$VENV_VLLM/bin/pip" install "vllm==$VLLM_PIN" pytest tblib
	fi
	# vLLM's own tests come in its source archive only. pip downloads an sdist after reading
	# its metadata, which runs vLLM's setup.py: without build isolation (its build deps are
	# small, torch is already in the venv), no extension built (target "empty"), the version
	# pinned (else it reads 0.33.0+empty and pip refuses it).
	if [ ! -d "$VLLM_SRC/tests/v1/kv_offload" ]; then
		"$VENV_VLLM/bin/pip" install -q "setuptools-scm>=8.0" "setuptools-rust>=1.9.0" wheel \
			jinja2 cmake ninja tblib
		tmp=$(mktemp -d)
		VLLM_VERSION_OVERRIDE=$VLLM_PIN VLLM_TARGET_DEVICE=empty "$VENV_VLLM/bin/pip" download \
			-q --no-deps --no-binary vllm --no-build-isolation -d "$tmp" "vllm==$VLLM_PIN"
		mkdir -p "$VLLM_SRC"
		# tests/ and the pytest configuration only: a vllm/ source tree there would shadow
		# the installed package (which has the compiled parts) on sys.path
		tar -xzf "$tmp/vllm-$VLLM_PIN.tar.gz" -C "$VLLM_SRC" --strip-components=1 \
			"vllm-$VLLM_PIN/tests" "vllm-$VLLM_PIN/pyproject.toml"
		rm -rf "$tmp"
	fi
	# the model vLLM's unit tests name, as a local config.json (no weights, no network)
	"$VENV_VLLM/bin/python" "$(dirname "$0")/opt125m_config.py" "$HF"
	echo "setup: vllm $VLLM_PIN in $VENV_VLLM, sources in $VLLM_SRC"
}

setup_sglang() {
	if have "$VENV_SGLANG" sglang "$SGLANG_PIN"; then
		echo "setup: sglang $SGLANG_PIN already in $VENV_SGLANG"
		return
	fi
	"$PY" -m venv "$VENV_SGLANG"
	"$VENV_SGLANG/bin/pip" install -q --upgrade pip
	"$VENV_SGLANG/bin/pip" install "sglang==$SGLANG_PIN" pytest
	echo "setup: sglang $SGLANG_PIN in $VENV_SGLANG"
}

case "$what" in
vllm) setup_vllm ;;
sglang) setup_sglang ;;
all) setup_vllm; setup_sglang ;;
*) echo "usage: $0 [vllm|sglang|all]" >&2; exit 2 ;;
esac
