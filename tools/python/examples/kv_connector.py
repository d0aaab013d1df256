#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""How a Python inference server's KV connector drives kvtier, with a real model's decode.

A vLLM-style server has a scheduler and a model runner; its KV connector is called at fixed
points. This example implements those points on kvtier (class KvtierConnector, method names
after vLLM's KVConnectorBase_V1) and runs them under a tiny scheduler + numpy model runner that
decodes Karpathy's stories260K (llama2.c checkpoint, ../shared/data/models) for several chat
sessions and turns, every K/V living only in kvtier blocks:

  scheduling       get_num_new_matched_tokens(): how many of the request's prompt tokens are
                   already cached, and in which tier. A returning chat session: its parked
                   sequence holds its whole history. A new one: kvt_seq_match_prefix says how
                   many leading prompt tokens other requests computed (a shared system prompt)
                   and kvt_seq_attach_prefix shares those blocks: prefill starts after them.
                   A session published in the persistent store by an earlier run (a server
                   restart) is reopened with kvt_seq_restore.
  before the step  start_load_kv(): the step's tokens are appended (kvt_seq_append: where to
                   write each new K/V), the batch is prepared (kvt_batch_prepare: every block
                   resident in HBM and pinned), and the next step's sequences are hinted
                   (kvt_engine_hint): a returning session's promotions (NVMe -> host -> HBM)
                   start while this step computes.
  per layer        wait_for_layer_load() (kvt_batch_wait_layer), save_kv_layer() (write the new
                   token's K/V at its slot), attention over the block table (Batch.kv gathers)
  after the step   wait_for_save(): kvt_batch_release (unpin; demotions may start)
  request done     request_finished(): kvt_seq_park to NVMe. The engine keeps a persistent
                   store (nvme_persist) and every sequence has a session_key, so a parked
                   session is published there once durable and survives a restart: run again
                   with the same --nvme-dir (and flags) and each session continues its chat.

The output is the same text kvtier-run prints for the same flags (greedy), which the tests check:
    kv_connector.py --steps 64
    kv_connector.py --sessions 2 --turns 2 --steps 40 --prompt "Lily had a"
    kv_connector.py --sessions 2 --prefix-share --prompt "<a long shared prompt>"
With --prefix-share session 1 runs its first turn alone and the other sessions attach the
prompt blocks it computed (as kvtier-run --prefix-share does); without it all sessions start
together, so nothing is cached yet when they are scheduled.
Runs on the emulated device (the HBM tier is host memory the numpy runner reads); on a GPU the
runner would be CUDA kernels reading the same block table.
"""

import argparse
import os
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvtier  # noqa: E402

BOS = 1
# kvtier-run's built-in prompts (tools/kvtier-run/runner.c): without --prompt, turn t of
# session s (0-based) uses BUILTIN_PROMPTS[(s * turns + t) % 8], as kvtier-run does
BUILTIN_PROMPTS = ("", "Once upon a time", "Lily had a little dog", "Tom went to the park",
                   "One day, a big red ball", "The sun was happy", "She saw a bird in the tree",
                   "They wanted to play")


# ---- the model: llama2.c checkpoint and tokenizer, numpy forward -------------------------------
class Model:
    """A llama2.c (version 0) checkpoint: 7 int32 of config, then float32 weights."""

    def __init__(self, path):
        raw = open(path, "rb").read()
        (self.dim, self.hidden, self.n_layers, self.n_heads, self.n_kv_heads, vocab,
         self.seq_len) = struct.unpack("7i", raw[:28])
        self.vocab = abs(vocab)
        w = np.frombuffer(raw, dtype=np.float32, offset=28)
        d, h, L, hs = self.dim, self.hidden, self.n_layers, self.dim // self.n_heads
        kvd = self.n_kv_heads * hs
        self.head_size, self.kv_dim = hs, kvd
        off = 0

        def take(*shape):
            nonlocal off
            n = int(np.prod(shape))
            a = w[off:off + n].reshape(shape)
            off += n
            return a
        self.emb = take(self.vocab, d)
        self.rms_att = take(L, d)
        self.wq, self.wk, self.wv = take(L, d, d), take(L, kvd, d), take(L, kvd, d)
        self.wo = take(L, d, d)
        self.rms_ffn = take(L, d)
        self.w1, self.w2, self.w3 = take(L, h, d), take(L, d, h), take(L, h, d)
        self.rms_final = take(d)
        take(self.seq_len, hs // 2)  # freq_cis_real (unused: computed as llama2.c does)
        take(self.seq_len, hs // 2)  # freq_cis_imag
        self.wcls = self.emb if vocab > 0 else take(self.vocab, d)

    @staticmethod
    def rmsnorm(x, w):
        ss = np.float32(np.dot(x, x) / np.float32(len(x))) + np.float32(1e-5)
        return (w * (x * np.float32(1.0 / np.sqrt(ss)))).astype(np.float32)

    def rope(self, v, pos):
        i = np.arange(0, len(v), 2)
        freq = 1.0 / np.power(10000.0, (i % self.head_size) / self.head_size).astype(np.float32)
        ang = (pos * freq).astype(np.float32)
        c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        out = v.copy()
        out[0::2] = v[0::2] * c - v[1::2] * s
        out[1::2] = v[0::2] * s + v[1::2] * c
        return out

    def attention(self, q, k, v):
        """q [dim]; k, v [n, n_kv_heads, head_size] -> [dim] (GQA: heads share KV heads)."""
        hs, rep = self.head_size, self.n_heads // self.n_kv_heads
        out = np.empty(self.dim, dtype=np.float32)
        for h in range(self.n_heads):
            qh = q[h * hs:(h + 1) * hs]
            kh, vh = k[:, h // rep, :], v[:, h // rep, :]
            sc = (kh @ qh) / np.float32(np.sqrt(hs))
            sc = np.exp(sc - sc.max())
            out[h * hs:(h + 1) * hs] = (sc / sc.sum()) @ vh
        return out


class Tokenizer:
    """llama2.c tokenizer.bin: max_token_length, then (score, len, bytes) per token."""

    def __init__(self, path, vocab):
        raw = open(path, "rb").read()
        off = 4
        self.pieces, self.scores = [], []
        for _ in range(vocab):
            score, n = struct.unpack_from("fi", raw, off)
            off += 8
            self.pieces.append(raw[off:off + n])
            off += n
            self.scores.append(score)
        self.ids = {p: i for i, p in enumerate(self.pieces)}

    def encode(self, text):
        """BOS, sentencepiece's dummy prefix, code points (byte fallback), greedy BPE."""
        toks = [BOS]
        if text:
            toks.append(self.ids.get(b" ", ord(" ") + 3))
        for ch in text:
            b = ch.encode()
            toks.extend([self.ids[b]] if b in self.ids else [x + 3 for x in b])
        while True:
            best = (-1e10, -1, -1)
            for i in range(len(toks) - 1):
                j = self.ids.get(self.pieces[toks[i]] + self.pieces[toks[i + 1]], -1)
                if j != -1 and self.scores[j] > best[0]:
                    best = (self.scores[j], j, i)
            if best[2] == -1:
                return toks
            toks[best[2]:best[2] + 2] = [best[1]]

    def decode(self, prev, tok):
        p = self.pieces[tok]
        if prev == BOS and p.startswith(b" "):
            p = p[1:]
        if p.startswith(b"<0x") and p.endswith(b">") and len(p) == 6:
            p = bytes([int(p[3:5], 16)])
        if len(p) == 1 and not (chr(p[0]).isprintable() or chr(p[0]).isspace()):
            return b""
        return p


# ---- the connector: the points where a server calls kvtier ------------------------------------
class KvtierConnector:
    """A vLLM-style KV connector on kvtier. One kvtier sequence per chat session (request id),
    opened with session_key = session id + 1; a finished turn parks it, the next turn finds it
    cached. A new session's prompt attaches the blocks of the same prefix computed earlier."""

    def __init__(self, engine, park_tier, host_blocks):
        self.engine = engine
        self.host_blocks = host_blocks  # HOST tier slots: a turn's start hints at most these
        self.park_tier = park_tier
        self.seqs = {}        # session id -> kvtier.Sequence
        self.batch = None     # the step's prepared batch
        self.table = None     # its block table
        self.slots = {}       # session id -> slot mapping entry of the step's new token
        self.stored = set(engine.session_list())  # sessions an earlier run published

    # scheduler side
    def get_num_new_matched_tokens(self, session, prompt, room):
        """Tokens of this request already cached, so prefill skips them: (tokens, tier name
        the slowest of them comes from, "restored" | "history" | "prefix" | None).
        @prompt: the turn's token ids; @room: positions the turn may compute (the last
        prompt token is always computed: its logits choose the first new token). A new
        session's matching prompt blocks are attached here, so they stay cached (shared,
        refcounted) until the request runs."""
        seq = self.seqs.get(session)
        how = "history"
        if seq is None and session + 1 in self.stored:  # published by an earlier run
            seq = self.seqs[session] = self.engine.restore(session + 1)
            how = "restored"
        if seq is not None:
            info = seq.info()
            slowest = max((t for t, n in enumerate(info["blocks_in"]) if n), default=None)
            return info["n_tokens"], _tier_name(slowest), how
        seq = self.seqs[session] = self.engine.open_sequence(session_key=session + 1)
        usable = prompt[:min(room, len(prompt)) - 1]
        matched, tier = self.engine.match_prefix(usable) if usable else (0, None)
        if not matched:
            return 0, None, None
        return seq.attach_prefix(usable), _tier_name(tier), "prefix"

    def start_turn(self, sessions):
        """The sessions whose turn starts now will be in the next step: their promotions
        (parked blocks, attached prefix blocks) start at once, for as many of their blocks as
        the HOST tier stages with a slot to spare (NVMe blocks come up through HOST): with
        kvtier 0.1, a hint that stages NVMe blocks into every HOST slot leaves the next
        kvt_batch_prepare of those sequences no room to move them (-ENOSPC, even with HBM
        free); the others come up at their prepare."""
        hinted, n = [], 0
        for s in sessions:
            n += self.seqs[s].info()["n_blocks"]
            if n >= self.host_blocks:
                break
            hinted.append(s)
        self.hint(hinted)

    def hint(self, sessions):
        if sessions:
            try:
                self.engine.hint([self.seqs[s] for s in sessions], steps_ahead=1)
            except kvtier.TooBigError:
                pass  # a forecast larger than HBM: the prepare will do what fits

    # worker side
    def start_load_kv(self, sessions, tokens, next_sessions):
        """Before the step: the step's tokens get their slots, the batch is prepared (resident
        and pinned), and the sequences of the next step are announced (kvt_engine_hint), so
        that their promotions overlap this step's compute. Here the next step is mostly this
        one's sessions, already resident (the hint then costs nothing); a server whose
        consecutive batches differ (rotating groups, more sessions than HBM holds) gains."""
        for s, t in zip(sessions, tokens):
            self.slots[s] = self.seqs[s].append([t])[0]
        self.batch = self.engine.prepare([self.seqs[s] for s in sessions])
        self.table = self.batch.block_table()
        self.hint(next_sessions)

    def wait_for_layer_load(self, layer):
        self.batch.wait_layer(layer)

    def save_kv_layer(self, session, layer, k, v):
        self.engine.write_kv(self.slots[session], layer, k, v)

    def layer_kv(self, index, layer):
        """K and V of batch entry @index for the attention kernel (here: numpy gather)."""
        return self.batch.kv(index, layer, self.table)

    def wait_for_save(self):
        """After the step: unpin (the step's writes were synchronous: no stream)."""
        self.batch.release()
        self.batch = self.table = None

    def request_finished(self, session):
        """The turn is over: the session's KV leaves HBM until the user comes back."""
        self.seqs[session].park(self.park_tier)

    def close(self):
        """Server shutdown: the sessions stay published in the store (closing a sequence
        would drop it), the engine's destroy keeps them."""
        self.seqs.clear()


def _tier_name(t):
    return None if t is None else kvtier.TIER_NAMES[t]


# ---- the server loop: scheduler + model runner ------------------------------------------------
def forward_batch(model, conn, sessions, tokens, positions, next_sessions):
    """One decode step for the batch; returns the logits of every session."""
    conn.start_load_kv(sessions, tokens, next_sessions)
    xs = [model.emb[t].copy() for t in tokens]
    for layer in range(model.n_layers):
        conn.wait_for_layer_load(layer)
        for i, s in enumerate(sessions):
            x = xs[i]
            xb = model.rmsnorm(x, model.rms_att[layer])
            q = model.rope(model.wq[layer] @ xb, positions[i])
            k = model.rope(model.wk[layer] @ xb, positions[i])
            v = (model.wv[layer] @ xb).astype(np.float32)
            conn.save_kv_layer(s, layer, k, v)
            kk, vv = conn.layer_kv(i, layer)
            x = x + model.wo[layer] @ model.attention(q, kk, vv)
            xb = model.rmsnorm(x, model.rms_ffn[layer])
            h1, h3 = model.w1[layer] @ xb, model.w3[layer] @ xb
            x = x + model.w2[layer] @ ((h1 / (1.0 + np.exp(-h1))) * h3).astype(np.float32)
            xs[i] = x.astype(np.float32)
    conn.wait_for_save()
    return [model.wcls @ model.rmsnorm(x, model.rms_final) for x in xs]


def schedule(args, tok, conn, s, turn):
    """Session @s's turn: ask the connector what is cached, skip those positions. Returns the
    turn's state (not yet admitted into the running batch)."""
    text = args.prompt
    if text is None:
        text = BUILTIN_PROMPTS[(s * args.turns + turn) % len(BUILTIN_PROMPTS)]
    prompt = tok.encode(text)
    cached, tier, how = conn.get_num_new_matched_tokens(s, prompt, args.steps)
    st = {"prompt": prompt, "local": 0, "token": prompt[0], "pos": cached, "text": b""}
    if how == "prefix":  # the attached prompt positions are not computed: emit their pieces
        for g in range(cached):
            st["text"] += tok.decode(prompt[g], prompt[g + 1])
        st.update(local=cached, token=prompt[cached])
    if args.verbose and (cached or turn):
        print(f"[scheduler] session {s + 1} turn {turn + 1}: {cached} tokens cached "
              f"({how}, slowest tier {tier}), prefill only the rest", file=sys.stderr)
    return st


def blocks_needed(args, model, st):
    """HBM blocks the turn's sequence occupies at its end: its cached history (a restored or
    returning session's whole chat so far) plus the positions this turn computes."""
    end = min(model.seq_len, st["pos"] - st["local"] + args.steps)
    return -(-end // args.tokens_per_block)


def admit(args, model, tok, conn, live, ready, pending, turn, hbm_blocks):
    """Move sessions from @ready into the running batch @live while their blocks fit in HBM
    (the whole batch is resident and pinned during a step), as kvtier-run does: sessions that
    do not fit wait for a later group. Returns the admitted sessions."""
    used = sum(blocks_needed(args, model, st) for st in live.values())
    admitted = []
    while ready:
        s = ready[0]
        if s not in pending:
            pending[s] = schedule(args, tok, conn, s, turn)
        need = blocks_needed(args, model, pending[s])
        if live and used + need > hbm_blocks:
            break
        if need > hbm_blocks:
            raise SystemExit(f"kv_connector: session {s + 1} turn {turn + 1} needs {need} "
                             f"blocks in HBM, which holds {hbm_blocks}: raise --hbm-blocks")
        live[s] = pending.pop(s)
        used += need
        admitted.append(ready.pop(0))
    return admitted


def run(args, model, tok, conn, hbm_blocks):
    """sessions x turns, the sessions of a turn batched step by step in groups that fit HBM;
    returns the texts. With --prefix-share the first turn of sessions 2.. starts once session
    1's is done."""
    texts = {}
    for turn in range(args.turns):
        live, pending = {}, {}
        first = 1 if turn == 0 and args.prefix_share else args.sessions
        ready, held = list(range(first)), list(range(first, args.sessions))
        conn.start_turn(admit(args, model, tok, conn, live, ready, pending, turn, hbm_blocks))
        while live or ready or held:
            if not live and not ready:
                ready, held = held, []
            new = admit(args, model, tok, conn, live, ready, pending, turn, hbm_blocks)
            if new:
                conn.start_turn(new)
            order = sorted(live)
            nxt = [s for s in order  # forecast: those not at their turn's last position
                   if live[s]["local"] + 1 < args.steps and live[s]["pos"] + 1 < model.seq_len]
            logits = forward_batch(model, conn, order, [live[s]["token"] for s in order],
                                   [live[s]["pos"] for s in order], nxt)
            for s, lg in zip(order, logits):
                st = live[s]
                st["local"] += 1
                nxt = (st["prompt"][st["local"]] if st["local"] < len(st["prompt"])
                       else int(np.argmax(lg)))
                done = nxt == BOS
                if not done:
                    st["text"] += tok.decode(st["token"], nxt)
                    done = st["local"] >= args.steps or st["pos"] + 1 >= model.seq_len
                if done:
                    texts[(s, turn)] = st["text"].decode("utf-8", "replace")
                    conn.request_finished(s)
                    del live[s]
                else:
                    st["token"], st["pos"] = nxt, st["pos"] + 1
    return texts


def positive(text):
    """argparse type: an integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def non_negative(text):
    """argparse type: an integer >= 0."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    data = os.environ.get("KVT_SHARED_DATA",
                          os.path.join(here, "..", "..", "..", "..", "shared", "data"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(data, "models", "stories260K.bin"))
    ap.add_argument("--tokenizer", default=os.path.join(data, "models", "tok512.bin"))
    ap.add_argument("--prompt", help="prompt of every turn (default: kvtier-run's built-in "
                    "prompts, one per session and turn; the first turn of session 1 is empty)")
    ap.add_argument("--steps", type=positive, default=64, help="positions per turn")
    ap.add_argument("--sessions", type=positive, default=1)
    ap.add_argument("--turns", type=positive, default=1)
    ap.add_argument("--tokens-per-block", type=positive, default=16)
    ap.add_argument("--hbm-blocks", type=non_negative, default=0,
                    help="default: room for 2 sessions of this run, and at least for one "
                    "session at the model's seq_len (a restored chat); sessions run in "
                    "groups that fit")
    ap.add_argument("--nvme-dir", help="the persistent NVMe store's directory (default: a temp "
                    "dir); sessions an earlier run published there continue their chat")
    ap.add_argument("--prefix-share", action="store_true",
                    help="session 1 runs its first turn alone, the others attach its prompt")
    ap.add_argument("--metrics", action="store_true", help="print Prometheus text at the end")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print(f"kv_connector: no model at {args.model}", file=sys.stderr)
        return 77
    model = Model(args.model)
    tok = Tokenizer(args.tokenizer, model.vocab)
    tpb = args.tokens_per_block
    per_session = -(-min(model.seq_len, args.steps * args.turns) // tpb)
    max_blocks = -(-model.seq_len // tpb)  # a session's longest chat, over restarts
    hbm_blocks = args.hbm_blocks or max(2 * per_session + 1, max_blocks)
    block = model.n_layers * 2 * tpb * model.kv_dim * 4
    with tempfile.TemporaryDirectory() as tmp, \
            kvtier.Engine(n_layers=model.n_layers, n_kv_heads=model.n_kv_heads,
                          head_dim=model.head_size, dtype="f32", tokens_per_block=tpb,
                          hbm_bytes=hbm_blocks * block,
                          host_bytes=per_session * block,
                          nvme_dir=args.nvme_dir or tmp,
                          nvme_bytes=2 * args.sessions * max_blocks * (block + 4096),
                          nvme_persist=True) as eng:
        conn = KvtierConnector(eng, kvtier.TIER_NVME, host_blocks=per_session)
        texts = run(args, model, tok, conn, hbm_blocks)
        eng.drain()  # the last parks complete (and are published) before the stats
        conn.close()
        if args.sessions == 1 and args.turns == 1:
            sys.stdout.write(texts[(0, 0)] + "\n")
        else:
            for s in range(args.sessions):
                for t in range(args.turns):
                    print(f"[session {s + 1} turn {t + 1}] {texts[(s, t)]}")
        if args.metrics:
            sys.stdout.write(eng.metrics_text())
        st = eng.stats()
        print(f"kv_connector: blocks moved {st['blocks_moved']}"
              f", prefix hit tokens {st['prefix_hit_tokens']}, hints {st['hints']}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
