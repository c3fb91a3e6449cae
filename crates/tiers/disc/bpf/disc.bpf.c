// SPDX-License-Identifier: MIT OR GPL-2.0
//
// DISC's kHook on the FE (seed 004 §3.5.2), TC part: one sequence space on the client's
// connection while the BE's DP writes payload bytes into it.
//
// For each client connection the FE owns (key: client ip/port, FE ip/port, network order),
// user space writes one epoch into its slot in `disc_slots`: `boundary`, the FE stack's sequence number
// at which the BE's payload was inserted; `off_lo`, the shift of the FE's bytes before it;
// `off_hi` = off_lo + the payload's length, the shift of the FE's bytes from `boundary` on.
// The payload occupies [boundary + off_lo, boundary + off_hi) in the client's view.
//
// - disc_egress (TC egress of the FE's client-side interface): the FE's segments get
//   seq += off_lo or off_hi (retransmissions of bytes before the boundary keep off_lo).
// - disc_ingress (TC ingress, same interface): the client's cumulative ACK is translated
//   back to the FE's view (an ACK inside the payload range acknowledges the FE up to
//   `boundary`); an ACK at or past the payload's start is recorded for DP (last ack,
//   window, count); a pure ACK strictly inside the payload range concerns DP alone and is
//   dropped, so the FE's stack never sees duplicate ACKs caused by bytes it did not send.
//
// Checksums are updated incrementally with bpf_l4_csum_replace (it leaves a
// CHECKSUM_PARTIAL packet to the offload, which sums the rewritten header itself).
//
// - disc_ingress also translates the client's SACK blocks to the FE's view, edge by edge as
//   the cumulative ACK; a block only of payload bytes (DP's business) is taken out of the
//   option, and an option left without blocks, or one it cannot rewrite, becomes NOPs.
//
// Limits of this first version (documented in the crate README): one epoch per
// connection (a new payload may be registered once the previous one is acknowledged);
// IPv4 only.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <stddef.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

struct conn_key {
	__u32 client_ip;
	__u32 fe_ip;
	__u16 client_port;
	__u16 fe_port;
};

/* One epoch of a connection. User space writes a whole epoch into the copy not in force
 * (struct conn_slot), then puts it in force by writing `cur`: a program sees either epoch
 * whole, never a mix of two (a shift from one and a boundary from the other). */
struct epoch {
	__u32 boundary;
	__u32 off_lo;
	__u32 off_hi;
	/* written by disc_ingress (from boundary + off_lo), read by the ack forwarder */
	__u32 last_ack;
	__u32 last_win;
	/* where the ACKs for DP also go (NOTIFY_*), until one acknowledges the whole
	 * payload (disc_ingress clears it) */
	__u32 notify;
	/* NOTIFY_CLONE: the FE's interface towards DP and its link address */
	__u32 dp_ifindex;
	__u8 dp_src_mac[6];
	__u8 pad[2];
	/* the payload DP is to send once the FE's segment ending at `boundary` (the answer's
	 * head) goes out; disc_egress then clones that segment to DP's link (DP_START_MAC)
	 * and clears it */
	__u32 start_id;
	/* NOTIFY_STACK: the link address of DP's interface, whose IP stack takes the clone */
	__u8 dp_dst_mac[6];
	__u8 pad2[2];
};

/* A connection's slot in disc_slots, shared with user space through mmap (the FE writes
 * an epoch per answer with plain stores instead of two bpf(2) calls: 8% of its CPU).
 * Invariant: user space writes only ep[cur ^ 1] (and `cur` after it) and programs only
 * ep[cur] (last_ack, last_win, notify, start_id) and the fields below `cur`; an epoch copy
 * is written again only two epochs later, one payload's round trip at least, far longer
 * than a program's run, so a program never reads a copy being rewritten. */
struct conn_slot {
	struct epoch ep[2];
	__u32 cur;
	__u32 acks;
	__u32 dp_acks;
	/* pure ACKs inside the payload range, kept from the FE's stack */
	__u32 dropped;
	/* written by disc_egress: the FE stack's own view, before any shift */
	__u32 shifted;
	__u32 fe_nxt;	/* highest seq + length the FE sent */
	__u32 fe_ack;	/* the FE's latest ACK (the client's next byte) */
	__u32 fe_win;	/* the FE's latest raw window field */
	__u32 fe_seen;	/* FE segments seen */
	__u32 sack_stripped;	/* client ACKs whose SACK option was made NOPs */
	/* written by disc_ingress: the client's latest raw window field (any ACK) and the
	 * ACK that carried it (client view): the window's right edge is
	 * cl_ack + (cl_win << cl_wscale) */
	__u32 cl_win;
	__u32 cl_ack;
	/* set by user space at registration: the client's window scale */
	__u32 cl_wscale;
	/* client ACKs whose SACK blocks disc_ingress translated to the FE's view */
	__u32 sack_translated;
};

/* The ACK for DP also goes to the ring disc_acks (the FE's forwarder sends it on). */
#define NOTIFY_RING 1
/* The ACK for DP is cloned to DP's link as it came from the client (dp_ifindex), with
 * the destination address DP_ACK_MAC: DP's tap takes it, DP's IP stack ignores it (not
 * its address), and the FE's user space has nothing to do per ACK. */
#define NOTIFY_CLONE 2
/* With NOTIFY_CLONE: only the ACK of the payload's last byte and duplicate ACKs are
 * cloned (DP sent the whole payload at once: the ACKs between tell it nothing). */
#define NOTIFY_ENDS 4
/* With NOTIFY_CLONE: the clone goes to DP's own link address (dp_dst_mac), for the BE's TCP
 * stack: DP sends the payload from a socket continuing the FE's connection (TCP_REPAIR),
 * which takes the client's ACKs, SACK blocks and timestamps as the FE's stack would. */
#define NOTIFY_STACK 8
static const __u8 DP_ACK_MAC[6] = { 0x02, 0xd1, 0x5c, 0x00, 0xac, 0x4b };
/* The link destination of the FE's head segment cloned to DP as its start signal: the
 * source address carries the payload id (4 bytes, network order) and the client's window
 * from the payload's first byte to its window's right edge, as a raw (scaled) field (2
 * bytes); the segment itself, shifted, tells DP where the payload starts and the FE's ACK
 * and window. */
static const __u8 DP_START_MAC[6] = { 0x02, 0xd1, 0x5c, 0x00, 0x5e, 0x0d };
/* As DP_START_MAC, for a head segment redirected to DP instead of cloned: DP sends the
 * head's bytes too, in front of the payload (the client gets head and payload in one
 * segment, one receive and one wake-up fewer). */
static const __u8 DP_HEAD_MAC[6] = { 0x02, 0xd1, 0x5c, 0x00, 0x4e, 0xad };
/* The longest head redirected (one segment, within the tap's 2,048-byte snap). */
#define HEAD_RIDES_MAX 1400

#define MAX_CONNS 65536

/* A connection's slot in disc_slots (user space hands slots out). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CONNS);
	__type(key, struct conn_key);
	__type(value, __u32);
} disc_index SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_CONNS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct conn_slot);
} disc_slots SEC(".maps");

static __always_inline struct conn_slot *slot_of(struct conn_key *k)
{
	__u32 *i = bpf_map_lookup_elem(&disc_index, k);

	return i ? bpf_map_lookup_elem(&disc_slots, i) : 0;
}

/* The epoch in force (see struct conn_slot). */
static __always_inline struct epoch *epoch_of(struct conn_slot *s)
{
	return &s->ep[*(volatile __u32 *)&s->cur & 1];
}

/* An ACK for DP, as the ack forwarder reads it from disc_acks: it waits on the ring's
 * descriptor instead of polling the map. */
struct ack_event {
	struct conn_key key;
	__u32 ack;
	__u32 win;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 18);
} disc_acks SEC(".maps");

static __always_inline int seq_before(__u32 a, __u32 b)
{
	return (__s32)(a - b) < 0;
}

static __always_inline int seq_after(__u32 a, __u32 b)
{
	return (__s32)(b - a) < 0;
}

/* Ethernet + IPv4 + TCP headers in the linear data; the IP header length, or -1. */
static __always_inline int parse(struct __sk_buff *skb, struct iphdr **ipp, struct tcphdr **tcpp)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct tcphdr *tcp;
	__u32 ihl;

	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_TCP || ip->ihl < 5)
		return -1;
	if (ip->frag_off & bpf_htons(0x3fff))
		return -1;
	ihl = ip->ihl * 4;
	tcp = (void *)ip + ihl;
	if ((void *)(tcp + 1) > end)
		return -1;
	*ipp = ip;
	*tcpp = tcp;
	return ihl;
}

static __always_inline void rewrite32(struct __sk_buff *skb, __u32 ihl, __u32 field,
				      __be32 old, __be32 new)
{
	__u32 at = sizeof(struct ethhdr) + ihl;

	bpf_l4_csum_replace(skb, at + offsetof(struct tcphdr, check), old, new, sizeof(new));
	bpf_skb_store_bytes(skb, at + field, &new, sizeof(new), 0);
}

/* A copy of the packet to DP's link with the link addresses `mac` (destination, source).
 * The packet's own link header is put back afterwards; every packet pointer is invalid
 * after this. */
static __always_inline void clone_to_dp(struct __sk_buff *skb, __u32 ifindex, const __u8 *mac)
{
	__u8 was[12];

	if (bpf_skb_load_bytes(skb, 0, was, sizeof(was)) < 0)
		return;
	if (bpf_skb_store_bytes(skb, 0, mac, 12, 0) < 0)
		return;
	bpf_clone_redirect(skb, ifindex, 0);
	bpf_skb_store_bytes(skb, 0, was, sizeof(was), 0);
}

SEC("classifier")
int disc_egress(struct __sk_buff *skb)
{
	struct iphdr *ip;
	struct tcphdr *tcp;
	struct conn_slot *s;
	struct epoch *e;
	int ihl = parse(skb, &ip, &tcp);
	__u32 seq, off, len, data, plain;
	__be32 old;

	if (ihl < 0)
		return TC_ACT_OK;
	struct conn_key k = {
		.client_ip = ip->daddr,
		.fe_ip = ip->saddr,
		.client_port = tcp->dest,
		.fe_port = tcp->source,
	};
	s = slot_of(&k);
	if (!s)
		return TC_ACT_OK;
	e = epoch_of(s);
	old = tcp->seq;
	seq = bpf_ntohl(old);
	data = bpf_ntohs(ip->tot_len) - ihl - tcp->doff * 4;
	len = data + tcp->syn + tcp->fin;
	/* Read now: rewrite32 invalidates the packet pointers. */
	plain = !tcp->syn && !tcp->fin && !tcp->rst;
	if (!s->fe_seen || seq_after(seq + len, s->fe_nxt))
		s->fe_nxt = seq + len;
	if (tcp->ack) {
		s->fe_ack = bpf_ntohl(tcp->ack_seq);
		s->fe_win = bpf_ntohs(tcp->window);
	}
	__sync_fetch_and_add(&s->fe_seen, 1);
	off = seq_before(seq, e->boundary) ? e->off_lo : e->off_hi;
	if (off) {
		rewrite32(skb, ihl, offsetof(struct tcphdr, seq), old, bpf_htonl(seq + off));
		__sync_fetch_and_add(&s->shifted, 1);
	}
	/* The answer's head is out: DP starts the payload right behind it, in the client's
	 * view (the clone is of the segment as shifted). Once: a retransmitted head does not
	 * start DP again. */
	if (e->start_id && data && seq + data == e->boundary && e->dp_ifindex) {
		__u32 id = bpf_htonl(e->start_id);
		__u32 shift = s->cl_wscale & 15;
		/* The client's window counts from the ACK that carried it, which may be before
		 * the head: measured from the payload's start, it is shorter by the bytes in
		 * between (a burst to the window DP was told once crossed the client's right
		 * edge by the head's length, and Linux drops such a segment while its receive
		 * queue holds data: a hole only DP's timer repaired). */
		__s32 room = (__s32)(s->cl_ack + (s->cl_win << shift) - (seq + off + data));
		__u32 raw = room > 0 ? (__u32)room >> shift : 0;
		__u16 win = bpf_htons(raw > 0xffff ? 0xffff : (__u16)raw);
		__u8 mac[12];

		e->start_id = 0;
		__builtin_memcpy(mac + 6, &id, 4);
		__builtin_memcpy(mac + 10, &win, 2);
		/* A short head without FIN goes to DP alone (DP sends it in front of the
		 * payload); should that segment be lost, the FE's stack sends the head again
		 * (start_id is clear: straight to the client). */
		if (data <= HEAD_RIDES_MAX && plain) {
			__builtin_memcpy(mac, DP_HEAD_MAC, 6);
			if (bpf_skb_store_bytes(skb, 0, mac, 12, 0) == 0)
				return bpf_redirect(e->dp_ifindex, 0);
		}
		__builtin_memcpy(mac, DP_START_MAC, 6);
		clone_to_dp(skb, e->dp_ifindex, mac);
	}
	return TC_ACT_OK;
}

#define MAX_OPTS 40

/* Makes the option bytes [from, to) of the TCP header at `tcp_at` NOPs, one aligned
 * 4-byte word at a time (each with its checksum update). A global function: the verifier
 * checks it once, not once per option of its caller's loop. */
__attribute__((noinline)) int disc_nop_out(struct __sk_buff *skb, __u32 tcp_at, __u32 from,
					   __u32 to)
{
	__u32 w, b;

	for (w = 0; w < MAX_OPTS / 4; w++) {
		__u32 at = sizeof(struct tcphdr) + w * 4;
		__u8 word[4], was[4];

		if (at + 4 <= from)
			continue;
		if (at >= to)
			break;
		if (bpf_skb_load_bytes(skb, tcp_at + at, word, 4) < 0)
			return 0;
		__builtin_memcpy(was, word, 4);
		for (b = 0; b < 4; b++)
			if (at + b >= from && at + b < to)
				word[b] = 1;
		bpf_l4_csum_replace(skb, tcp_at + offsetof(struct tcphdr, check),
				    *(__u32 *)was, *(__u32 *)word, 4);
		bpf_skb_store_bytes(skb, tcp_at + at, word, 4, 0);
	}
	return 1;
}

/* An epoch's map from the client's view of the sequence space to the FE stack's; the
 * payload is [d0, d1) in the client's view. */
struct seq_view {
	__u32 boundary, off_lo, off_hi, d0, d1;
};

static __always_inline struct seq_view view_of(const struct epoch *e)
{
	struct seq_view v = {
		.boundary = e->boundary,
		.off_lo = e->off_lo,
		.off_hi = e->off_hi,
		.d0 = e->boundary + e->off_lo,
		.d1 = e->boundary + e->off_hi,
	};

	return v;
}

/* A sequence number of the client's view in the FE stack's, for the cumulative ACK and
 * every SACK edge alike: before the payload shifted back by off_lo, after it by off_hi; a
 * byte of the payload, the boundary (the FE sent nothing there). */
static __always_inline __u32 fe_view(const struct seq_view *v, __u32 x)
{
	if (!seq_after(x, v->d0))
		return x - v->off_lo;
	if (!seq_before(x, v->d1))
		return x - v->off_hi;
	return v->boundary;
}

/* The option walk's state, shared with its bpf_loop callback. */
struct opt_walk {
	struct __sk_buff *skb;
	__u32 tcp_at;
	__u32 i;	/* offset in the TCP header of the next option */
	__u32 end;	/* the header's length */
	struct seq_view v;	/* the epoch in force */
	__u32 stripped;	/* a SACK option was made NOPs */
	__u32 translated;	/* a SACK option's blocks were rewritten */
};

/*
 * The SACK option at offset i (length len) in the FE's view: each block's edges go through
 * fe_view; a block that maps to nothing (payload bytes only: DP's, which the FE's stack
 * must not count as its own) is taken out, the ones after it move up, the option's length
 * shrinks and NOPs fill the bytes freed. Returns 1 when it rewrote the option or left it
 * as it was, 0 when the caller should make it NOPs (no block left, an odd offset, a
 * malformed length).
 */
static __always_inline int translate_sack(struct opt_walk *w, __u32 i, __u32 len)
{
	__be32 blk[8], out[8];
	__u32 size = len - 2, n, kept = 0, j;
	__u32 ihl = w->tcp_at - sizeof(struct ethhdr);

	if ((i & 1) || size == 0 || size > 32 || (size & 7))
		return 0;
	n = size / 8;
	if (bpf_skb_load_bytes(w->skb, w->tcp_at + i + 2, blk, size) < 0)
		return 0;
	for (j = 0; j < 4; j++) {
		__u32 l, r;

		if (j >= n)
			break;
		l = fe_view(&w->v, bpf_ntohl(blk[2 * j]));
		r = fe_view(&w->v, bpf_ntohl(blk[2 * j + 1]));
		if (!seq_after(r, l))
			continue;
		out[2 * kept] = bpf_htonl(l);
		out[2 * kept + 1] = bpf_htonl(r);
		kept++;
	}
	if (kept == 0)
		return 0;
	if (kept != n) {
		/* kind and length: an aligned 16-bit word (i is even) */
		__u16 was, now;

		if (bpf_skb_load_bytes(w->skb, w->tcp_at + i, &was, 2) < 0)
			return 0;
		now = bpf_htons((5 << 8) | (2 + 8 * kept));
		bpf_l4_csum_replace(w->skb, w->tcp_at + offsetof(struct tcphdr, check), was, now,
				    2);
		bpf_skb_store_bytes(w->skb, w->tcp_at + i, &now, 2, 0);
	}
	/* i is even: each edge is at an even offset, where rewrite32's checksum update holds */
	for (j = 0; j < 4; j++) {
		__u32 at = i + 2 + j * 8;

		if (j >= kept)
			break;
		rewrite32(w->skb, ihl, at, blk[2 * j], out[2 * j]);
		rewrite32(w->skb, ihl, at + 4, blk[2 * j + 1], out[2 * j + 1]);
	}
	if (kept != n)
		disc_nop_out(w->skb, w->tcp_at, i + 2 + 8 * kept, i + len);
	w->translated = 1;
	return 1;
}

/* One option: a NOP is skipped, a SACK translated (or made NOPs), anything else stepped
 * over; 1 ends the walk (end of options, malformed, or past the header). */
static long opt_step(__u32 n, void *ctx)
{
	struct opt_walk *w = ctx;
	__u8 kind, len;
	__u32 i = w->i;

	if (i >= w->end || i >= sizeof(struct tcphdr) + MAX_OPTS)
		return 1;
	if (bpf_skb_load_bytes(w->skb, w->tcp_at + i, &kind, 1) < 0 || kind == 0)
		return 1;
	if (kind == 1) {
		w->i = i + 1;
		return 0;
	}
	if (i + 1 >= w->end || bpf_skb_load_bytes(w->skb, w->tcp_at + i + 1, &len, 1) < 0)
		return 1;
	if (len < 2 || i + len > w->end)
		return 1;
	if (kind == 5 && !translate_sack(w, i, len)) {
		disc_nop_out(w->skb, w->tcp_at, i, i + len);
		w->stripped = 1;
	}
	w->i = i + len;
	return 0;
}

/*
 * The client's SACK blocks are in its view of the sequence space; once the connection has
 * a shift, the FE's stack would read them as its own and could mark bytes as received that
 * the client never had. They are translated as the cumulative ACK is (translate_sack); what
 * cannot be becomes NOPs, and the FE's stack, seeing an ACK without SACK (legal: SACK is
 * advisory), recovers on duplicate ACKs and its timer. The walk is a bpf_loop callback
 * (verified once) reading one byte at a time with bpf_skb_load_bytes.
 */
static __always_inline void sack_to_fe(struct __sk_buff *skb, __u32 ihl, __u32 doff,
				       struct conn_slot *s, const struct seq_view *v)
{
	struct opt_walk w = {
		.skb = skb,
		.tcp_at = sizeof(struct ethhdr) + ihl,
		.i = sizeof(struct tcphdr),
		.end = doff * 4,
		.v = *v,
	};

	if (w.end > sizeof(struct tcphdr) + MAX_OPTS)
		return;
	bpf_loop(MAX_OPTS, opt_step, &w, 0);
	if (w.stripped)
		__sync_fetch_and_add(&s->sack_stripped, 1);
	if (w.translated)
		__sync_fetch_and_add(&s->sack_translated, 1);
}

SEC("classifier")
int disc_ingress(struct __sk_buff *skb)
{
	struct iphdr *ip;
	struct tcphdr *tcp;
	struct conn_slot *s;
	struct epoch *e;
	int ihl = parse(skb, &ip, &tcp);
	__u32 ack, fe_ack, payload, doff, notify, bare, prev, last;
	struct seq_view v;
	__be32 old;

	if (ihl < 0)
		return TC_ACT_OK;
	struct conn_key k = {
		.client_ip = ip->saddr,
		.fe_ip = ip->daddr,
		.client_port = tcp->source,
		.fe_port = tcp->dest,
	};
	s = slot_of(&k);
	if (!s || !tcp->ack)
		return TC_ACT_OK;
	e = epoch_of(s);
	__sync_fetch_and_add(&s->acks, 1);
	s->cl_win = bpf_ntohs(tcp->window);
	s->cl_ack = bpf_ntohl(tcp->ack_seq);
	/* Read now: clone_to_dp invalidates the packet pointers. */
	old = tcp->ack_seq;
	ack = bpf_ntohl(old);
	doff = tcp->doff;
	payload = bpf_ntohs(ip->tot_len) - ihl - doff * 4;
	bare = payload == 0 && !tcp->syn && !tcp->fin && !tcp->rst;
	v = view_of(e);
	if (v.off_hi != v.off_lo && seq_after(ack, v.d0)) {
		prev = e->last_ack;
		e->last_ack = ack;
		e->last_win = bpf_ntohs(tcp->window);
		__sync_fetch_and_add(&s->dp_acks, 1);
		notify = e->notify;
		last = !seq_before(ack, v.d1);
		if (notify && last)
			e->notify = 0;
		if (notify & NOTIFY_RING) {
			struct ack_event ev = { .key = k, .ack = ack, .win = e->last_win };

			/* A full ring loses the event: the forwarder also reads the map now
			 * and then. */
			bpf_ringbuf_output(&disc_acks, &ev, sizeof(ev), 0);
		}
		if ((notify & NOTIFY_CLONE) && e->dp_ifindex &&
		    (!(notify & NOTIFY_ENDS) || last || ack == prev)) {
			__u8 mac[12];

			if (notify & NOTIFY_STACK)
				__builtin_memcpy(mac, e->dp_dst_mac, 6);
			else
				__builtin_memcpy(mac, DP_ACK_MAC, 6);
			__builtin_memcpy(mac + 6, e->dp_src_mac, 6);
			clone_to_dp(skb, e->dp_ifindex, mac);
		}
	}
	fe_ack = fe_view(&v, ack);
	if (bare && seq_after(ack, v.d0) && seq_before(ack, v.d1)) {
		/* a pure ACK of DP's bytes only: nothing for the FE's stack */
		__sync_fetch_and_add(&s->dropped, 1);
		return TC_ACT_SHOT;
	}
	if (doff > 5 && (v.off_lo || v.off_hi))
		sack_to_fe(skb, ihl, doff, s, &v);
	if (fe_ack != ack)
		rewrite32(skb, ihl, offsetof(struct tcphdr, ack_seq), old, bpf_htonl(fe_ack));
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/*
 * The netem substitute (this kernel has no sch_netem): attached at TC ingress and egress of
 * the client's interfaces in tests, drops each IPv4 TCP packet with probability
 * disc_loss[0] / 2^32, drawn with bpf_get_prandom_u32. Counters in disc_loss[1] (seen) and
 * disc_loss[2] (dropped).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3);
	__type(key, __u32);
	__type(value, __u32);
} disc_loss SEC(".maps");

SEC("classifier")
int disc_lossy(struct __sk_buff *skb)
{
	struct iphdr *ip;
	struct tcphdr *tcp;
	__u32 k0 = 0, k1 = 1, k2 = 2;
	__u32 *p, *seen, *dropped;

	if (parse(skb, &ip, &tcp) < 0)
		return TC_ACT_OK;
	p = bpf_map_lookup_elem(&disc_loss, &k0);
	seen = bpf_map_lookup_elem(&disc_loss, &k1);
	dropped = bpf_map_lookup_elem(&disc_loss, &k2);
	if (!p || !seen || !dropped)
		return TC_ACT_OK;
	__sync_fetch_and_add(seen, 1);
	if (*p && bpf_get_prandom_u32() < *p) {
		__sync_fetch_and_add(dropped, 1);
		return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}
