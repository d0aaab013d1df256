#!/usr/bin/env bash
# Run the vLLM and SGLang integration tests (tools/integrations/tests) and the vLLM tests that
# apply to an offloading spec / KV connector, in the venvs tools/integrations/setup.sh made.
# A venv without its pinned package is skipped with a line saying so (exit 0).
#
#   tools/integrations/run.sh [BUILD_DIR]       (default: build; needs BUILD_DIR/libkvtier.so)
#
# Environment: KVT_VENV_VLLM, KVT_VENV_SGLANG, KVT_VLLM_SRC, KVT_HF_HOME as setup.sh;
# KVT_VLLM_OWN_TESTS=0 skips vLLM's own tests (they take most of the time).
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
VENV_VLLM=${KVT_VENV_VLLM:-/work/venv-vllm}
VENV_SGLANG=${KVT_VENV_SGLANG:-/work/venv-sglang}
VLLM_SRC=${KVT_VLLM_SRC:-/work/vllm-src}
HF=${KVT_HF_HOME:-/work/hf-home}
lib=$(realpath "$build/libkvtier.so" 2>/dev/null) || { echo "integrations: no $build/libkvtier.so: build first" >&2; exit 1; }
export KVTIER_LIBRARY=$lib
rc=0

pinned() { # venv package version
	[ -x "$1/bin/python" ] &&
		[ "$("$1/bin/python" -c "import importlib.metadata as m; print(m.version('$2'))" 2>/dev/null)" = "$3" ]
}

if pinned "$VENV_VLLM" vllm 0.33.0 && [ -d "$VLLM_SRC/tests/v1/kv_offload" ]; then
	export HF_HOME=$HF HF_HUB_OFFLINE=1 VLLM_TARGET_DEVICE=cpu KVT_VLLM_SRC=$VLLM_SRC
	"$VENV_VLLM/bin/python" tools/integrations/opt125m_config.py "$HF" >/dev/null
	echo "integrations: vLLM 0.33.0 scheduler with kvtier (tools/integrations/tests)"
	"$VENV_VLLM/bin/python" -m pytest -q -p no:cacheprovider \
		tools/integrations/tests/test_vllm_scheduler.py tools/integrations/tests/test_vllm_mirror.py \
		tools/integrations/tests/test_vllm_restart.py tools/integrations/tests/test_vllm_remote.py \
		tools/integrations/tests/test_vllm_hybrid.py || rc=1
	if [ "${KVT_VLLM_OWN_TESTS:-1}" != 0 ]; then
		# The ones that apply to an offloading spec / connector and run on CPU (801 passed, 2
		# skipped here); the rest of tests/v1/kv_offload (gpu_worker, swap_blocks_*, the
		# shared offload region, tiering, file_mapper) needs CUDA or is not about the spec.
		echo "integrations: vLLM's own tests: tests/v1/kv_offload/{test_factory.py,cpu/test_manager.py,cpu/policies,cpu/test_capacity.py}, tests/v1/kv_connector/unit/offloading_connector"
		(cd "$VLLM_SRC" && "$VENV_VLLM/bin/python" -m pytest -q -p no:cacheprovider \
			tests/v1/kv_offload/test_factory.py tests/v1/kv_offload/cpu/test_manager.py \
			tests/v1/kv_offload/cpu/policies tests/v1/kv_offload/cpu/test_capacity.py \
			tests/v1/kv_connector/unit/offloading_connector) || rc=1
	fi
else
	echo "integrations: vllm 0.33.0 not installed in $VENV_VLLM (or no sources in $VLLM_SRC): vLLM tests skipped (tools/integrations/setup.sh vllm installs it)"
fi

if pinned "$VENV_SGLANG" sglang 0.5.23; then
	echo "integrations: SGLang 0.5.23 HiCache storage backend on kvtier"
	"$VENV_SGLANG/bin/python" -m pytest -q -p no:cacheprovider \
		tools/integrations/tests/test_sglang_backend.py || rc=1
else
	echo "integrations: sglang 0.5.23 not installed in $VENV_SGLANG: SGLang tests skipped (tools/integrations/setup.sh sglang installs it)"
fi
exit $rc
