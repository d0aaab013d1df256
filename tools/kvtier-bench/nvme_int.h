/* SPDX-License-Identifier: MIT */
/* tools/kvtier-bench/nvme_int.h - pieces of the nvme mode shared between its files. */
#ifndef KVTB_NVME_INT_H
#define KVTB_NVME_INT_H

#include <stdio.h>

/**
 * kvtb_codec_table() - dump the K/V blocks that stories260K produces (kvtier-run's decode loop,
 * fp32, fp16 and bf16 K/V) and print, per element type, the ratio and single-core speed of
 * plain LZ4, bit-plane shuffle + LZ4, byte-plane shuffle + LZ4 and zstd -1 (when built with
 * libzstd) as a markdown table on @out. @model/@tok: checkpoint and tokenizer paths.
 * Returns 0, or a negative code (model missing: the caller reports and skips the table).
 */
int kvtb_codec_table(FILE *out, const char *model, const char *tok, unsigned sessions);

#endif
