#!/usr/bin/env bash
# tests/layers_check.sh SRC - the layers point one way, downward (docs/ARCHITECTURE.md "Layers"):
# engine/ -> transfer/, tiers/, evict/, kernels/ -> tiers/base/. Nothing below engine/ includes an
# engine/ header other than the public kvtier.h, tiers/base/ includes nothing of the project but
# kvtier.h, and transfer/, evict/ and kernels/ include only themselves and tiers/base/ (transfer/
# may use kernels/: the CUDA backend launches them).
set -euo pipefail
src=$1
bad=0
check() { # check DIR ALLOWED-REGEX: every project include under DIR matches ALLOWED-REGEX
	local dir=$1 allowed=$2 f line inc
	while IFS= read -r f; do
		while IFS= read -r line; do
			inc=$(printf '%s\n' "$line" | sed -E 's/.*#include "([^"]+)".*/\1/')
			[ -e "$(dirname "$f")/$inc" ] && continue # a file of the same folder
			if ! printf '%s\n' "$inc" | grep -Eq "$allowed"; then
				echo "layers_check: ${f#"$src"/} includes \"$inc\""
				bad=1
			fi
		done < <(grep -E '^[[:space:]]*#[[:space:]]*include "' "$f" || true)
	done < <(find "$src/$dir" -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \))
}
check tiers/base '^(kvtier\.h|tiers/base/[a-z_]+\.h)$'
check tiers '^(kvtier\.h|tiers/[a-z_]+\.h|tiers/base/[a-z_]+\.h)$'
check evict '^(kvtier\.h|evict/[a-z_]+\.h|tiers/base/[a-z_]+\.h)$'
check kernels '^(kvtier\.h|kernels/[a-z_]+\.h|tiers/base/[a-z_]+\.h)$'
check transfer '^(kvtier\.h|transfer/[a-z_]+\.h|kernels/[a-z_]+\.h|tiers/base/[a-z_]+\.h)$'
[ "$bad" -eq 0 ] || exit 1
echo "layers_check: tiers/, evict/, transfer/, kernels/ include nothing of engine/ but kvtier.h"
