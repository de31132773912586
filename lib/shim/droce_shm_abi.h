/*
 * droce shared-memory ABI between a client process (the shim) and droced.
 * C99 and C++ compatible; no DPDK, no libibverbs dependency.
 *
 * Every object with a data path (QP, SRQ, CQ) lives in one shared-memory
 * region: a memfd (hugetlbfs-backed when large enough) that droced creates
 * and passes to the client with SCM_RIGHTS in the create response. Both map it
 * MAP_SHARED. A region is a region header followed by one or two rings:
 *
 *  region (memfd, fd passed daemon -> client)
 *  +0     +--------------------------------------------------------------+
 *         | droce_shm_region_hdr  (64 B)  magic, version, kind, rings,   |
 *         |                               ring_off[2] (written once by   |
 *         |                               the daemon before the fd leaves)|
 *  +64    +==============================================================+
 *         | ring 0  (QP: send queue, SRQ: receive queue, CQ: completions)|
 *         |  +0    line 0: prod   (written by the producer only)         |
 *         |  +64   line 1: cons   (written by the consumer only)         |
 *         |  +128  line 2: notify (CQ: armed / events; receive: done)   |
 *         |  +192  line 3: geometry (magic, entries, entry_size, ...;   |
 *         |                send/receive: idle, db_bit: doorbells)        |
 *         |  +256  entry[0] | entry[1] | ... | entry[entries-1]         |
 *         +==============================================================+
 *         | ring 1  (QP without SRQ: receive queue), same layout         |
 *         +--------------------------------------------------------------+
 *
 *  ring roles
 *    send queue   : producer = client (ibv_post_send), consumer = daemon core
 *    recv queue   : producer = client (ibv_post_recv), consumer = daemon core
 *    SRQ          : producer = client (ibv_post_srq_recv), consumer = daemon
 *    completion   : producer = daemon core, consumer = client (ibv_poll_cq)
 *
 *  indexes
 *    prod and cons are free-running uint32_t counters (they wrap at 2^32);
 *    entries is a power of two; slot = index & (entries - 1);
 *    used = prod - cons (unsigned), 0 <= used <= entries;
 *    empty: prod == cons;  full: prod - cons == entries.
 *
 *  memory order (see ring.h where each one is used)
 *    producer: fill slots with plain stores, then
 *              store prod  RELEASE   (publishes the slots: the doorbell;
 *                                    one store per batch, no syscall)
 *              load  cons  ACQUIRE   (the consumer has finished reading the
 *                                    slots it released before we reuse them)
 *    consumer: load  prod  ACQUIRE   (pairs with the producer's release:
 *                                    the slots below prod are complete)
 *              read slots, then
 *              store cons  RELEASE   (returns the slots; one store per batch)
 *    Each side keeps a private cached copy of the other side's index and of
 *    the geometry, so a poll touches the shared index line only when the
 *    cache says empty/full.
 *
 *  slot lifetime (the verbs rule "max_send_wr outstanding work requests")
 *    The daemon consumes a work request by copying it into its own state
 *    and returns the slot (cons store) no later than it publishes that work
 *    request's completion. So a program that has reaped the completion of a
 *    work request always finds its slot free again.
 *
 *  receive depth (the verbs rule "max_recv_wr outstanding receives")
 *    A receive WQE stays outstanding after the daemon has copied it out of
 *    the ring (cons): the engine holds it until a message completes it or
 *    the QP flushes it. On a receive ring (QP or SRQ) the daemon publishes
 *    `done` (line 2; RELEASE), the index of the first WQE it has not finished
 *    yet (completed, flushed, dropped, or taken by a QP from an SRQ, where
 *    rxe frees the slot too). done <= cons, and it moves forward only. The
 *    client's producer follows done instead of cons (ACQUIRE), so
 *    ibv_post_recv / ibv_post_srq_recv fail with ENOMEM while prod - done
 *    equals the ring size (max_recv_wr / max_wr), as a kernel device does.
 *
 *  CQ notification (ibv_req_notify_cq, completion channels)
 *    armed  : client stores DROCE_CQ_ARM_NEXT or DROCE_CQ_ARM_SOLICITED
 *             (SEQ_CST); the daemon, after publishing a CQE (release store
 *             of prod, then a SEQ_CST fence), exchanges armed with 0
 *             (SEQ_CST) and, if it was armed (and the CQE qualifies),
 *             increments events (RELEASE) and writes 1 to the completion
 *             channel's eventfd. The client's ibv_get_cq_event reads the
 *             eventfd (the only syscall, and only for programs that sleep)
 *             and finds the CQ whose events counter moved (ACQUIRE).
 *
 *  doorbells (ABI 3; the daemon polls only the rings that have work)
 *    A client that opened its doorbell region (protocol op OpenDoorbell: one
 *    droce_shm_doorbell per connection, fd passed daemon -> client) owns one
 *    bit in it per QP and per SRQ (db_bit in line 3 of the object's rings,
 *    written by the daemon before the fd leaves; DROCE_SHM_DB_NONE: no bit,
 *    the daemon polls the ring on every turn). The daemon stops polling a
 *    ring after it found it empty for a while and then only looks at it again
 *    when its bit is set (and, a few objects a turn, in a slow sweep).
 *    producer: store prod            SEQ_CST (instead of RELEASE), then
 *              load  idle            SEQ_CST; if it is 1:
 *              word[bit / 64] |= 1 << bit % 64   (atomic OR, RELEASE)
 *              summary |= 1 << bit / 64          (atomic OR, RELEASE)
 *    daemon, before it stops polling a ring (park):
 *              store idle = 1        SEQ_CST
 *              load  prod            SEQ_CST; entries: store idle = 0 and
 *                                    go on polling it
 *    daemon, each turn: load summary (relaxed); when non-zero exchange it
 *              with 0, exchange each word it names with 0 (ACQUIRE), and
 *              for each bit store idle = 0 (SEQ_CST) on the object's rings
 *              and poll them again.
 *    The two SEQ_CST store -> load pairs are Dekker's: either the daemon's
 *    reload of prod sees the new entries, or the producer's load of idle
 *    sees 1 and rings the bit; a posted WQE is never left unseen.
 *
 *  trust
 *    The daemon never trusts the region: it keeps its own copy of the
 *    geometry, treats an index that moved by more than entries as a fatal
 *    error for that object, and validates every field of every entry.
 */
#ifndef DROCE_SHM_ABI_H
#define DROCE_SHM_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define DROCE_SHM_STATIC_ASSERT(c, m) static_assert(c, m)
#define DROCE_SHM_ALIGNOF(t) alignof(t)
extern "C" {
#else
#define DROCE_SHM_STATIC_ASSERT(c, m) _Static_assert(c, m)
#define DROCE_SHM_ALIGNOF(t) _Alignof(t)
#endif

#define DROCE_SHM_CACHELINE 64
#define DROCE_SHM_ALIGNED __attribute__((aligned(DROCE_SHM_CACHELINE)))

#define DROCE_SHM_MAGIC 0x48535244u /* "DRSH" little-endian */
#define DROCE_SHM_RING_MAGIC 0x474e5244u /* "DRNG" */
#define DROCE_SHM_ABI_VERSION 3u /* 2: receive rings' done index; 3: doorbells */

/* Doorbell region (ABI 3): one per client connection, see "doorbells". */
#define DROCE_SHM_DB_MAGIC 0x42445244u /* "DRDB" */
#define DROCE_SHM_DB_WORDS 64u
#define DROCE_SHM_DB_BITS (DROCE_SHM_DB_WORDS * 64u) /* objects with a doorbell bit per client */
#define DROCE_SHM_DB_NONE 0xffffffffu

/* Limits that the entry sizes below fix. */
#define DROCE_SHM_MAX_SGE 8         /* per send or receive work request */
#define DROCE_SHM_MAX_INLINE 128    /* bytes of inline send data */
#define DROCE_SHM_MAX_RING 32768u   /* entries per ring */

enum droce_shm_region_kind {
  DROCE_SHM_REGION_QP = 1,  /* ring 0 = send queue, ring 1 = receive queue (absent with an SRQ) */
  DROCE_SHM_REGION_SRQ = 2, /* ring 0 = shared receive queue */
  DROCE_SHM_REGION_CQ = 3,  /* ring 0 = completion queue */
};

enum droce_shm_ring_kind {
  DROCE_SHM_RING_SEND = 1,
  DROCE_SHM_RING_RECV = 2,
  DROCE_SHM_RING_CQ = 3,
};

/* Region header: written once by the daemon before the fd is sent. */
struct droce_shm_region_hdr {
  uint32_t magic;      /* DROCE_SHM_MAGIC */
  uint32_t version;    /* DROCE_SHM_ABI_VERSION */
  uint32_t kind;       /* enum droce_shm_region_kind */
  uint32_t nrings;     /* 1 or 2 */
  uint64_t size;       /* bytes of the region */
  uint64_t ring_off[2];/* byte offset of each ring from the region start */
  uint32_t object_num; /* QPN, SRQ number or CQ number */
  uint32_t reserved[5];
} DROCE_SHM_ALIGNED;
DROCE_SHM_STATIC_ASSERT(sizeof(struct droce_shm_region_hdr) == 64, "region header is one line");

/* Doorbell region: written by the client (atomic ORs), cleared by the daemon
 * (atomic exchanges). Line 0 is written once by the daemon. */
struct droce_shm_doorbell {
  uint32_t magic;    /* DROCE_SHM_DB_MAGIC */
  uint32_t version;  /* DROCE_SHM_ABI_VERSION */
  uint32_t nbits;    /* DROCE_SHM_DB_BITS */
  uint32_t reserved[13];
  uint64_t summary DROCE_SHM_ALIGNED; /* bit w: word[w] has a bit set */
  uint64_t summary_pad[7];
  uint64_t word[DROCE_SHM_DB_WORDS] DROCE_SHM_ALIGNED; /* bit b of word w: object w * 64 + b has work */
} DROCE_SHM_ALIGNED;
DROCE_SHM_STATIC_ASSERT(sizeof(struct droce_shm_doorbell) == 128 + 8 * DROCE_SHM_DB_WORDS, "doorbell region");

/* Ring header: four cache lines, then the entries. */
struct droce_shm_ring_hdr {
  /* line 0: producer index. Written by the producer only (RELEASE), read by
   * the consumer (ACQUIRE). */
  uint32_t prod;
  uint32_t prod_pad[15];
  /* line 1: consumer index. Written by the consumer only (RELEASE), read by
   * the producer (ACQUIRE). */
  uint32_t cons DROCE_SHM_ALIGNED;
  uint32_t cons_pad[15];
  /* line 2: CQ notification (see the comment at the top). */
  uint32_t armed DROCE_SHM_ALIGNED; /* enum droce_cq_arm; client sets, daemon clears */
  uint32_t events;                  /* daemon increments per event delivered */
  uint32_t overflows;               /* daemon increments when a CQE found the ring full */
  uint32_t done;                    /* receive rings: WQEs the daemon finished (see the top) */
  uint32_t notify_pad[12];
  /* line 3: geometry, written once by the daemon (and the doorbell flag). */
  uint32_t magic DROCE_SHM_ALIGNED; /* DROCE_SHM_RING_MAGIC */
  uint32_t kind;                    /* enum droce_shm_ring_kind */
  uint32_t entries;                 /* power of two, <= DROCE_SHM_MAX_RING */
  uint32_t entry_size;              /* sizeof the entry type of this kind */
  uint32_t max_sge;                 /* the object's negotiated limits */
  uint32_t max_inline;
  /* Doorbells (see the top), on this line because the daemon writes it only
   * when it parks or unparks the ring: the producer's load of idle on each
   * publish hits its cache (`done`'s line moves with every receive). */
  uint32_t idle;                    /* send/receive rings: 1 = the daemon waits for the doorbell */
  uint32_t db_bit;                  /* send/receive rings: the object's doorbell bit, written once
                                       by the daemon; DROCE_SHM_DB_NONE: no doorbell, always polled */
  uint32_t geom_pad[8];
  /* entries follow at offset DROCE_SHM_RING_HDR_SIZE */
} DROCE_SHM_ALIGNED;
#define DROCE_SHM_RING_HDR_SIZE 256
DROCE_SHM_STATIC_ASSERT(sizeof(struct droce_shm_ring_hdr) == DROCE_SHM_RING_HDR_SIZE, "ring header");
DROCE_SHM_STATIC_ASSERT(offsetof(struct droce_shm_ring_hdr, cons) == 64, "cons on its own line");
DROCE_SHM_STATIC_ASSERT(offsetof(struct droce_shm_ring_hdr, armed) == 128, "notify line");
DROCE_SHM_STATIC_ASSERT(offsetof(struct droce_shm_ring_hdr, magic) == 192, "geometry line");

enum droce_cq_arm {
  DROCE_CQ_ARM_NONE = 0,
  DROCE_CQ_ARM_NEXT = 1,      /* any next completion */
  DROCE_CQ_ARM_SOLICITED = 2, /* next solicited completion or error */
};

/* Work-request opcodes: the values of enum ibv_wr_opcode (rdma-core 44). */
enum droce_wr_opcode {
  DROCE_WR_RDMA_WRITE = 0,
  DROCE_WR_RDMA_WRITE_WITH_IMM = 1,
  DROCE_WR_SEND = 2,
  DROCE_WR_SEND_WITH_IMM = 3,
  DROCE_WR_RDMA_READ = 4,
  DROCE_WR_ATOMIC_CMP_AND_SWP = 5,
  DROCE_WR_ATOMIC_FETCH_AND_ADD = 6,
  DROCE_WR_LOCAL_INV = 7,
  DROCE_WR_BIND_MW = 8,
  DROCE_WR_SEND_WITH_INV = 9,
};

/* Send flags: the values of enum ibv_send_flags. */
enum droce_send_flags {
  DROCE_SEND_FENCE = 1u << 0,
  DROCE_SEND_SIGNALED = 1u << 1,
  DROCE_SEND_SOLICITED = 1u << 2,
  DROCE_SEND_INLINE = 1u << 3,
  DROCE_SEND_IP_CSUM = 1u << 4,
  /* Not an ibv_send_flags bit: a BIND_MW entry posted by ibv_bind_mw (a type 1
   * window) rather than by ibv_post_send (type 2). */
  DROCE_SEND_BIND_TYPE1 = 1u << 30,
};

/* A scatter/gather element: the fields of struct ibv_sge. addr is the
 * client's virtual address inside a region it registered with lkey. */
struct droce_shm_sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};
DROCE_SHM_STATIC_ASSERT(sizeof(struct droce_shm_sge) == 16, "sge");

/* Send work request (ring kind SEND): what struct ibv_send_wr carries.
 * 64 B of fields, then either num_sge SGEs or inline_len bytes of data.
 * BIND_MW (no data) uses: imm_data = the window's rkey, rkey = its new rkey,
 * remote_addr / compare_add = address / length of the range, swap = the MR's
 * lkey (low 32 bits) | the window's access flags << 32. */
struct droce_shm_send_wqe {
  uint64_t wr_id;
  uint64_t remote_addr;     /* RDMA read/write, atomics */
  uint64_t compare_add;     /* atomic: compare (CMP_AND_SWP) or add (FETCH_AND_ADD) */
  uint64_t swap;            /* atomic CMP_AND_SWP */
  uint32_t rkey;            /* RDMA read/write, atomics */
  uint32_t imm_data;        /* *_WITH_IMM: network byte order as in ibv_send_wr;
                               SEND_WITH_INV / LOCAL_INV: the rkey to invalidate;
                               BIND_MW: the window's rkey (its index names it) */
  uint32_t send_flags;      /* enum droce_send_flags */
  uint32_t ah;              /* UD: the AH handle the client got from create AH */
  uint32_t remote_qpn;      /* UD */
  uint32_t remote_qkey;     /* UD */
  uint8_t opcode;           /* enum droce_wr_opcode */
  uint8_t num_sge;          /* 0..DROCE_SHM_MAX_SGE, 0 when inline */
  uint16_t inline_len;      /* bytes in inline_data when DROCE_SEND_INLINE */
  uint32_t reserved;
  union {
    struct droce_shm_sge sge[DROCE_SHM_MAX_SGE];
    uint8_t inline_data[DROCE_SHM_MAX_INLINE];
  } u;
} DROCE_SHM_ALIGNED;
DROCE_SHM_STATIC_ASSERT(offsetof(struct droce_shm_send_wqe, u) == 64, "send wqe fields are one line");
DROCE_SHM_STATIC_ASSERT(sizeof(struct droce_shm_send_wqe) == 192, "send wqe is 3 lines");

/* Receive work request (ring kinds RECV): what struct ibv_recv_wr carries. */
struct droce_shm_recv_wqe {
  uint64_t wr_id;
  uint32_t num_sge; /* 0..DROCE_SHM_MAX_SGE */
  uint32_t reserved;
  struct droce_shm_sge sge[DROCE_SHM_MAX_SGE];
} DROCE_SHM_ALIGNED;
DROCE_SHM_STATIC_ASSERT(sizeof(struct droce_shm_recv_wqe) == 192, "recv wqe is 3 lines");

/* Completion (ring kind CQ): the fields of struct ibv_wc. Status, opcode and
 * flags carry the values of enum ibv_wc_status, ibv_wc_opcode, ibv_wc_flags. */
struct droce_shm_cqe {
  uint64_t wr_id;
  uint32_t status;
  uint32_t opcode;
  uint32_t vendor_err;
  uint32_t byte_len;
  uint32_t imm_data;   /* network byte order, or the invalidated rkey */
  uint32_t qp_num;
  uint32_t src_qp;
  uint32_t wc_flags;
  uint16_t pkey_index;
  uint16_t slid;
  uint8_t sl;
  uint8_t dlid_path_bits;
  uint16_t reserved0;
  uint64_t reserved[2];
} DROCE_SHM_ALIGNED;
DROCE_SHM_STATIC_ASSERT(sizeof(struct droce_shm_cqe) == 64, "cqe is one line");

/* Bytes a ring of `entries` entries of `entry_size` bytes occupies. */
static inline uint64_t droce_shm_ring_bytes(uint32_t entries, uint32_t entry_size) {
  return (uint64_t)DROCE_SHM_RING_HDR_SIZE + (uint64_t)entries * entry_size;
}

#ifdef __cplusplus
}
#endif
#endif /* DROCE_SHM_ABI_H */
