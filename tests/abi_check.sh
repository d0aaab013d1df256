#!/usr/bin/env bash
# tests/abi_check.sh LIB HEADER - the dynamic symbols libkvtier.so exports are exactly the
# functions kvtier.h declares KVT_API, each versioned KVTIER_* (engine/kvtier.map); nothing else
# (no internal kvt_ helper, no dependency's symbol) leaks.
set -euo pipefail
lib=$1
hdr=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# KVT_API <type words and *> name( : the word right before the first '('
grep -o '^KVT_API[^(]*(' "$hdr" | sed -E 's/.*[ *]([a-z_0-9]+)\($/\1/' | sort -u >"$tmp/want"
nm -D --defined-only "$lib" | awk '$2 ~ /^[TWDBRV]$/ { print $3 }' | sort -u >"$tmp/have"
if grep -v '@@\?KVTIER_' "$tmp/have" | grep -q .; then
	echo "abi_check: exported without a KVTIER_ version:"; grep -v '@@\?KVTIER_' "$tmp/have"
	exit 1
fi
sed -E 's/@.*//' "$tmp/have" | sort -u >"$tmp/names"
if ! diff -u "$tmp/want" "$tmp/names"; then
	echo "abi_check: exported symbols differ from the KVT_API functions of $hdr"
	exit 1
fi
# the functions of the first release (tests/abi_0.1.txt): any other one versioned KVTIER_0.1
# fell into that node's kvt_* catch-all, i.e. it was added without a node of its own in
# engine/kvtier.map (an older library could not be told apart at load time)
grep '@@\?KVTIER_0\.1$' "$tmp/have" | sed -E 's/@.*//' | sort -u >"$tmp/v01"
if ! diff -u "$(dirname "$0")/abi_0.1.txt" "$tmp/v01"; then
	echo "abi_check: KVTIER_0.1 symbols differ from tests/abi_0.1.txt: a new function needs"
	echo "a node of its own in engine/kvtier.map"
	exit 1
fi
echo "abi_check: $(wc -l <"$tmp/names") symbols, all KVT_API, all versioned"
