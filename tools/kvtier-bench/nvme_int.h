/* SPDX-License-Identifier: MIT */
/* tools/kvtier-bench/nvme_int.h - pieces of the nvme mode shared between its files. */
#ifndef KVTB_NVME_INT_H
#define KVTB_NVME_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvtier.h"

/**
 * kvtb_codec_table() - dump the K/V blocks that stories260K produces (kvtier-run's decode loop,
 * fp32, fp16 and bf16 K/V) and print, per element type, the ratio and single-core speed of
 * plain LZ4, bit-plane shuffle + LZ4, byte-plane shuffle + LZ4 and zstd -1 (when built with
 * libzstd) as a markdown table on @out. @model/@tok: checkpoint and tokenizer paths.
 * Returns 0, or a negative code (model missing: the caller reports and skips the table).
 */
int kvtb_codec_table(FILE *out, const char *model, const char *tok, unsigned sessions);

/** kvtb_fill_bf16() - fill @n bytes at @p (a multiple of 8 is filled; the tail left) with
 * bf16-like values from the xorshift stream of @seed: sign and exponent bytes narrow,
 * mantissa bytes noisy (what the codec sees in real K/V). */
void kvtb_fill_bf16(uint8_t *p, size_t n, uint64_t seed);

/** What the hybrid park/resume run needs of the nvme mode's options. */
struct nb_hybrid_opts {
	const char *dir;      /* the NVMe tier's directory (group 1's file in DIR/group1) */
	uint32_t sessions;    /* sessions parked then resumed */
	uint32_t tokens;      /* tokens per session */
	uint32_t host_blocks; /* HOST tier of the FULL pool, 2 MiB blocks (STATE: 8 slots) */
	uint32_t workers;     /* the NVMe tier's workers */
	int nvme_codec;       /* enum kvt_codec */
	bool staged;          /* no zero-copy: the HOST registration refused */
};

/** One layout's park/resume figures (seconds summed over the sessions, bytes as doubles). */
struct nb_pr_result {
	double tp, tr;              /* park (until durable on NVMe), resume (until ready), s */
	double bytes;               /* the sessions' bytes parked: blocks x slot bytes */
	double nvme_w, nvme_r;      /* the engine's bytes_moved HOST->NVMe during the parks and
				       NVMe->HOST during the resumes (block bytes) */
	uint64_t full_blocks;       /* FULL (single layout: all) blocks parked */
	uint64_t state_blocks;      /* STATE slots parked (0 for the single layout) */
	uint64_t full_block_bytes;  /* bytes of one FULL block */
	uint64_t state_block_bytes; /* bytes of one STATE slot (0 for the single layout) */
	uint32_t reparks;           /* parks repeated by kvtb_park_nvme */
};

/**
 * kvtb_park_nvme() - park sequence @s to NVMe and drain, until every block of it has a copy
 * on NVMe: kvt_seq_park documents that after a park to NVMe and a drain every block is there,
 * but a park of more blocks than the NVMe queue depth leaves the rest in HOST only, so the
 * park is repeated while a block of @s has a copy in HBM or HOST (at most 8 times, each
 * repeat counted in *@reparks; the NVMe bytes moved then tell what was written). Returns 0 or
 * the engine's error.
 */
int kvtb_park_nvme(struct kvt_engine *e, kvt_seq_id s, uint32_t *reparks);

/**
 * kvtb_park_resume_hybrid() - park @o->sessions hybrid sessions of @o->tokens tokens (a FULL
 * group of 8 layers and a STATE group of 24 with Qwen3-Next-80B's Gated DeltaNet state;
 * nvme_hybrid.c says how it is scaled) to NVMe one after another, then resume each until a
 * batch holding it has both groups' last layers ready. Fills @r. Returns 0 or a kvtier error
 * with kvtr_last_error() set.
 */
int kvtb_park_resume_hybrid(const struct nb_hybrid_opts *o, struct nb_pr_result *r);

#endif
