// The control protocol between the shim client and droced's ShimServer.
//
// Transport: a SOCK_SEQPACKET Unix-domain socket (message boundaries kept,
// connection-oriented: a dead client is a closed connection). One request,
// then one response, always in that order. File descriptors travel with
// SCM_RIGHTS beside the message that names them.
//
// Layout: fixed binary structs, host byte order (both ends are on one host),
// a header then exactly the body struct of the op (the server rejects any
// other length with -EINVAL). Bodies carry libibverbs' own pointer-free
// structs (ibv_device_attr, ibv_port_attr, ibv_qp_attr, ibv_srq_attr,
// ibv_ah_attr, ibv_qp_cap) so values pass through unchanged; only the
// header of verbs.h is used, not the library.
//
// Handles: 32-bit, per connection, never reused within a connection, 0 =
// none. A client can only name entries of its own table.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace droce::shim::proto {

constexpr uint32_t kMagic = 0x434f5244;  // "DROC"
constexpr uint16_t kVersion = 1;
constexpr uint32_t kMaxDevices = 8;
constexpr uint32_t kMaxGids = 16;  // a port's GID table (gid_tbl_len): slots past the populated ones are empty
// Completion vectors of a device (ibv_context::num_comp_vectors): a CQ's
// comp_vector must be below it.
constexpr uint32_t kCompVectors = 1;
constexpr size_t kMaxMessage = 1024;
constexpr const char* kDefaultSocket = "/run/droce/verbs.sock";

enum class Op : uint16_t {
  ListDevices = 1,   // -> ListDevicesResp (allowed before OpenDevice)
  OpenDevice,        // OpenDeviceReq -> OpenDeviceResp
  QueryDevice,       // Empty -> ibv_device_attr
  QueryPort,         // PortReq -> ibv_port_attr
  QueryGidTable,     // PortReq -> GidTableResp
  AllocPd,           // Empty -> HandleResp
  DeallocPd,         // HandleReq -> Empty
  RegMr,             // RegMrReq + fd -> RegMrResp
  DeregMr,           // HandleReq -> Empty
  CreateChannel,     // Empty -> HandleResp + eventfd
  DestroyChannel,    // HandleReq -> Empty
  CreateCq,          // CreateCqReq -> CreateCqResp + region fd
  DestroyCq,         // HandleReq -> Empty
  CreateSrq,         // CreateSrqReq -> CreateSrqResp + region fd
  ModifySrq,         // ModifySrqReq -> Empty
  QuerySrq,          // HandleReq -> ibv_srq_attr
  DestroySrq,        // HandleReq -> Empty
  CreateQp,          // CreateQpReq -> CreateQpResp + region fd
  ModifyQp,          // ModifyQpReq -> Empty
  QueryQp,           // QueryQpReq -> QueryQpResp
  DestroyQp,         // HandleReq -> Empty
  CreateAh,          // CreateAhReq -> CreateAhResp
  DestroyAh,         // HandleReq -> Empty
  OpenAsync,         // Empty -> Empty + the client's async eventfd (one per connection)
  GetAsyncEvent,     // Empty -> AsyncEventResp, -EAGAIN when none is pending
  // ---- RDMA CM (cm_backend.h; the drop-in librdmacm). Allowed before
  // OpenDevice: a CM connection opens no device. -ENOSYS without a CM backend.
  CmCreateChannel,   // Empty -> HandleResp + eventfd (semaphore: one count per queued event)
  CmDestroyChannel,  // HandleReq -> Empty (its ids must be gone: -EBUSY)
  CmCreateId,        // CmCreateIdReq -> HandleResp
  CmDestroyId,       // HandleReq -> Empty (established: DREQ; being set up: REJ; its unread events dropped)
  CmMigrateId,       // CmMigrateIdReq -> Empty (its unread events move along)
  CmBindAddr,        // CmAddrReq -> CmIdInfo (port 0: an ephemeral port is picked)
  CmResolveAddr,     // CmResolveAddrReq -> Empty; event ADDR_RESOLVED / ADDR_ERROR
  CmResolveRoute,    // CmIdTimeoutReq -> Empty; event ROUTE_RESOLVED
  CmListen,          // CmListenReq -> Empty
  CmConnect,         // CmConnParamReq -> Empty (REQ / SIDR_REQ goes out)
  CmAccept,          // CmConnParamReq -> Empty (REP / SIDR_REP)
  CmReject,          // CmRejectReq -> Empty
  CmEstablish,       // HandleReq -> Empty (active: RTU, after the QP reached RTS)
  CmDisconnect,      // HandleReq -> Empty (DREQ, or DREP to the peer's DREQ)
  CmInitQpAttr,      // CmInitQpAttrReq -> CmInitQpAttrResp
  CmGetEvent,        // HandleReq (channel) -> CmEventResp; -EAGAIN when none is queued
  CmQueryId,         // HandleReq -> CmIdInfo
  // ---- added after the CM ops (numbers above unchanged)
  ResizeCq,          // ResizeCqReq -> CreateCqResp (same handle) + the new region fd
  AttachMcast,       // McastReq -> Empty (ibv_attach_mcast: UD QPs only, else -EINVAL)
  DetachMcast,       // McastReq -> Empty (ibv_detach_mcast: -EINVAL when not attached)
  CmJoinMulticast,   // CmJoinReq -> Empty; event MULTICAST_JOIN (the front attaches the id's QP)
  // memory windows (appended: the values above do not move)
  AllocMw,           // AllocMwReq -> AllocMwResp
  DeallocMw,         // HandleReq -> Empty (a bound window is unbound first)
  // doorbells (appended; droce_shm_abi.h, "doorbells")
  OpenDoorbell,      // Empty -> DoorbellResp + the region fd (once per connection,
                     // before the QPs and SRQs that get a bit; -EOPNOTSUPP: none)
  Count_
};

struct ReqHdr {
  uint32_t magic;
  uint16_t version;
  uint16_t op;
  uint32_t seq;
  uint32_t reserved;
};
struct RespHdr {
  uint32_t magic;
  uint16_t op;
  uint16_t nfds;  // fds attached with SCM_RIGHTS
  uint32_t seq;
  int32_t status;  // 0 or -errno; the body follows only when 0
};

struct Empty {};
struct HandleReq {
  uint32_t handle;
};
struct HandleResp {
  uint32_t handle;
};

struct DeviceInfo {
  char name[64];
  uint64_t node_guid;  // network byte order, as ibv_get_device_guid returns
  uint32_t index;
  uint32_t phys_port_cnt;
};
struct ListDevicesResp {
  uint32_t count;
  uint32_t reserved;
  DeviceInfo dev[kMaxDevices];
};

struct OpenDeviceReq {
  uint32_t index;
  uint32_t abi_version;  // DROCE_SHM_ABI_VERSION of the client
};
struct OpenDeviceResp {
  DeviceInfo info;
};

struct DoorbellResp {
  uint64_t region_size;
  uint32_t nbits;  // DROCE_SHM_DB_BITS
  uint32_t reserved;
};

struct PortReq {
  uint32_t port;
};

struct GidTableResp {
  uint32_t count;
  uint32_t reserved;
  ibv_gid_entry entry[kMaxGids];
};

// The client's buffer memory: `fd` (SCM_RIGHTS) is a memfd whose byte
// fd_offset is the client's address map_addr; the server maps
// [fd_offset, fd_offset + map_len) and registers [addr, addr + length).
struct RegMrReq {
  uint32_t pd;
  uint32_t access;  // ibv_access_flags
  uint64_t addr;
  uint64_t length;
  uint64_t iova;
  uint64_t map_addr;  // page aligned, <= addr
  uint64_t map_len;   // page multiple, covers [addr, addr + length)
  uint64_t fd_offset; // page aligned
};
// ibv_alloc_mw. Binding is a send work request (droce_shm_abi.h, BIND_MW).
struct AllocMwReq {
  uint32_t pd;
  uint32_t type;  // enum ibv_mw_type
};
struct AllocMwResp {
  uint32_t handle;
  uint32_t rkey;  // the window's key before any bind
};
struct RegMrResp {
  uint32_t handle;
  uint32_t lkey;
  uint32_t rkey;
  uint32_t reserved;
};

struct CreateCqReq {
  uint32_t cqe;
  uint32_t channel;  // handle or 0
  uint32_t comp_vector;
  uint32_t reserved;
};
struct CreateCqResp {
  uint32_t handle;
  uint32_t cqn;
  uint32_t cqe;          // actual capacity reported to the program
  uint32_t ring_entries;
  uint64_t region_size;
};

// ibv_resize_cq: a new region replaces the CQ's, holding its unread
// completions; the client maps it and reads nothing from the old one after
// sending this (-EINVAL when more than cqe completions are unread).
struct ResizeCqReq {
  uint32_t handle;
  uint32_t cqe;
};

struct CreateSrqReq {
  uint32_t pd;
  uint32_t reserved;
  ibv_srq_attr attr;  // max_wr, max_sge, srq_limit
};
struct CreateSrqResp {
  uint32_t handle;
  uint32_t srqn;
  ibv_srq_attr attr;  // actual
  uint32_t ring_entries;
  uint32_t reserved;
  uint64_t region_size;
};
struct ModifySrqReq {
  uint32_t handle;
  uint32_t mask;  // ibv_srq_attr_mask
  ibv_srq_attr attr;
};

struct CreateQpReq {
  uint32_t pd;
  uint32_t send_cq;
  uint32_t recv_cq;
  uint32_t srq;  // 0 = none
  uint32_t qp_type;  // ibv_qp_type
  uint32_t sq_sig_all;
  ibv_qp_cap cap;
};
struct CreateQpResp {
  uint32_t handle;
  uint32_t qpn;
  ibv_qp_cap cap;  // actual
  uint32_t sq_entries;
  uint32_t rq_entries;  // 0 with an SRQ
  uint64_t region_size;
};
struct ModifyQpReq {
  uint32_t handle;
  uint32_t mask;  // ibv_qp_attr_mask
  ibv_qp_attr attr;
};
struct QueryQpReq {
  uint32_t handle;
  uint32_t mask;
};
struct QueryQpResp {
  ibv_qp_attr attr;
  ibv_qp_cap cap;  // as created
  uint32_t qp_type;
  uint32_t sq_sig_all;
};

struct CreateAhReq {
  uint32_t pd;
  uint32_t reserved;
  ibv_ah_attr attr;
};
struct CreateAhResp {
  uint32_t handle;
  uint32_t ah_num;  // what send WQEs carry in droce_shm_send_wqe.ah
};

// ibv_attach_mcast / ibv_detach_mcast: the QP's handle and the group's MGID
// (an IPv6 multicast address or an IPv4-mapped 224.0.0.0/4 one; lid is
// ignored on RoCE).
struct McastReq {
  uint32_t qp;
  uint16_t lid;
  uint16_t reserved;
  ibv_gid gid;
};

// An asynchronous event (ibv_get_async_event): the eventfd of OpenAsync counts
// them (semaphore); each GetAsyncEvent takes one.
struct AsyncEventResp {
  uint32_t event_type;  // ibv_event_type
  uint32_t handle;      // the object it is about: a QP, a CQ (IBV_EVENT_CQ_ERR) or an SRQ (IBV_EVENT_SRQ_*)
};

// ---- RDMA CM. Addresses are sockaddr_in / sockaddr_in6 in a
// sockaddr_storage-sized field (family AF_INET or AF_INET6, port in network
// order as in a sockaddr). Handles of ids and channels are per connection.
struct CmAddr {
  uint8_t bytes[128];  // struct sockaddr_storage
};
struct CmCreateIdReq {
  uint32_t channel;   // handle
  uint32_t ps;        // enum rdma_port_space
  uint32_t qp_type;   // ibv_qp_type (RC, UC, UD)
  uint32_t reserved;
};
struct CmMigrateIdReq {
  uint32_t id;
  uint32_t channel;
};
struct CmAddrReq {
  uint32_t id;
  uint32_t reserved;
  CmAddr addr;
};
struct CmResolveAddrReq {
  uint32_t id;
  uint32_t timeout_ms;
  CmAddr src;  // family 0: none (droced picks the source address of the route)
  CmAddr dst;
};
struct CmIdTimeoutReq {
  uint32_t id;
  uint32_t timeout_ms;
};
struct CmListenReq {
  uint32_t id;
  uint32_t backlog;
};
// rdma_conn_param (private data copied in), plus the QP the id uses.
struct CmConnParam {
  uint8_t private_data[196];
  uint8_t private_data_len;
  uint8_t responder_resources;
  uint8_t initiator_depth;
  uint8_t flow_control;
  uint8_t retry_count;
  uint8_t rnr_retry_count;
  uint8_t srq;
  uint8_t reserved;
  uint32_t qp_num;  // the id's QP (0: none, then the program moves its QP itself)
  uint32_t qkey;    // UD
};
struct CmConnParamReq {
  uint32_t id;
  uint32_t reserved;
  CmConnParam param;
};
struct CmRejectReq {
  uint32_t id;
  uint32_t private_data_len;
  uint8_t private_data[148];
};
struct CmInitQpAttrReq {
  uint32_t id;
  uint32_t qp_state;  // ibv_qp_state wanted: INIT, RTR or RTS
};
struct CmInitQpAttrResp {
  ibv_qp_attr attr;
  uint32_t mask;  // ibv_qp_attr_mask
  uint32_t reserved;
};
// What an id is bound to: its device (OpenDevice index), port and addresses.
struct CmIdInfo {
  uint32_t dev;       // UINT32_MAX: not bound to a device yet
  uint32_t port_num;  // 1
  CmAddr src;
  CmAddr dst;
  ibv_gid sgid;
  ibv_gid dgid;
  uint16_t pkey;
  uint16_t reserved[3];
};
struct CmEventResp {
  uint32_t event;      // enum rdma_cm_event_type
  int32_t status;
  uint32_t id;         // the id it is about (CONNECT_REQUEST: a new id, already in the channel)
  uint32_t listen_id;  // CONNECT_REQUEST: the listening id
  CmConnParam param;   // CONNECT_REQUEST / ESTABLISHED / REJECTED / CONNECT_RESPONSE: what the peer sent
  CmIdInfo info;       // the id's addresses (a new id's are set here)
  ibv_ah_attr ah_attr; // UD: the address of the peer (ESTABLISHED after SIDR_REP, CONNECT_REQUEST)
  uint32_t ud_qp_num;
  uint32_t ud_qkey;
};

// rdma_join_multicast(_ex): the group's address (an IPv4 224.0.0.0/4 or IPv6
// ff00::/8 address) on a UD id bound to a device. droced keeps no state: it
// queues MULTICAST_JOIN with ah_attr (dgid = the MGID: ::ffff:a.b.c.d for
// IPv4 as Linux's cma for RoCEv2, the IPv6 address as is), ud_qp_num
// 0xFFFFFF and ud_qkey RDMA_UDP_QKEY; the front attaches and detaches the QP.
struct CmJoinReq {
  uint32_t id;
  uint32_t join_flags;  // rdma_cm_join_mc_attr_ex join_flags (FULLMEMBER or SENDONLY_FULLMEMBER)
  CmAddr addr;
};

// The body type of each op's request and response.
template <Op O> struct Body;
#define DROCE_SHIM_OP(O, Req, Resp)      \
  template <> struct Body<Op::O> {       \
    using Request = Req;                 \
    using Response = Resp;               \
  };
DROCE_SHIM_OP(ListDevices, Empty, ListDevicesResp)
DROCE_SHIM_OP(OpenDevice, OpenDeviceReq, OpenDeviceResp)
DROCE_SHIM_OP(QueryDevice, Empty, ibv_device_attr)
DROCE_SHIM_OP(QueryPort, PortReq, ibv_port_attr)
DROCE_SHIM_OP(QueryGidTable, PortReq, GidTableResp)
DROCE_SHIM_OP(AllocPd, Empty, HandleResp)
DROCE_SHIM_OP(DeallocPd, HandleReq, Empty)
DROCE_SHIM_OP(RegMr, RegMrReq, RegMrResp)
DROCE_SHIM_OP(DeregMr, HandleReq, Empty)
DROCE_SHIM_OP(CreateChannel, Empty, HandleResp)
DROCE_SHIM_OP(DestroyChannel, HandleReq, Empty)
DROCE_SHIM_OP(CreateCq, CreateCqReq, CreateCqResp)
DROCE_SHIM_OP(DestroyCq, HandleReq, Empty)
DROCE_SHIM_OP(CreateSrq, CreateSrqReq, CreateSrqResp)
DROCE_SHIM_OP(ModifySrq, ModifySrqReq, Empty)
DROCE_SHIM_OP(QuerySrq, HandleReq, ibv_srq_attr)
DROCE_SHIM_OP(DestroySrq, HandleReq, Empty)
DROCE_SHIM_OP(CreateQp, CreateQpReq, CreateQpResp)
DROCE_SHIM_OP(ModifyQp, ModifyQpReq, Empty)
DROCE_SHIM_OP(QueryQp, QueryQpReq, QueryQpResp)
DROCE_SHIM_OP(DestroyQp, HandleReq, Empty)
DROCE_SHIM_OP(CreateAh, CreateAhReq, CreateAhResp)
DROCE_SHIM_OP(DestroyAh, HandleReq, Empty)
DROCE_SHIM_OP(OpenAsync, Empty, Empty)
DROCE_SHIM_OP(GetAsyncEvent, Empty, AsyncEventResp)
DROCE_SHIM_OP(CmCreateChannel, Empty, HandleResp)
DROCE_SHIM_OP(CmDestroyChannel, HandleReq, Empty)
DROCE_SHIM_OP(CmCreateId, CmCreateIdReq, HandleResp)
DROCE_SHIM_OP(CmDestroyId, HandleReq, Empty)
DROCE_SHIM_OP(CmMigrateId, CmMigrateIdReq, Empty)
DROCE_SHIM_OP(CmBindAddr, CmAddrReq, CmIdInfo)
DROCE_SHIM_OP(CmResolveAddr, CmResolveAddrReq, Empty)
DROCE_SHIM_OP(CmResolveRoute, CmIdTimeoutReq, Empty)
DROCE_SHIM_OP(CmListen, CmListenReq, Empty)
DROCE_SHIM_OP(CmConnect, CmConnParamReq, Empty)
DROCE_SHIM_OP(CmAccept, CmConnParamReq, Empty)
DROCE_SHIM_OP(CmReject, CmRejectReq, Empty)
DROCE_SHIM_OP(CmEstablish, HandleReq, Empty)
DROCE_SHIM_OP(CmDisconnect, HandleReq, Empty)
DROCE_SHIM_OP(CmInitQpAttr, CmInitQpAttrReq, CmInitQpAttrResp)
DROCE_SHIM_OP(CmGetEvent, HandleReq, CmEventResp)
DROCE_SHIM_OP(CmQueryId, HandleReq, CmIdInfo)
DROCE_SHIM_OP(ResizeCq, ResizeCqReq, CreateCqResp)
DROCE_SHIM_OP(AttachMcast, McastReq, Empty)
DROCE_SHIM_OP(DetachMcast, McastReq, Empty)
DROCE_SHIM_OP(CmJoinMulticast, CmJoinReq, Empty)
DROCE_SHIM_OP(AllocMw, AllocMwReq, AllocMwResp)
DROCE_SHIM_OP(DeallocMw, HandleReq, Empty)
DROCE_SHIM_OP(OpenDoorbell, Empty, DoorbellResp)
#undef DROCE_SHIM_OP

// Empty bodies are sent as zero bytes.
template <typename T> constexpr size_t body_size() {
  if constexpr (std::is_same_v<T, Empty>) return 0; else return sizeof(T);
}

}  // namespace droce::shim::proto
