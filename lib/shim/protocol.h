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
constexpr uint32_t kMaxGids = 16;
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

// An asynchronous event (ibv_get_async_event): the eventfd of OpenAsync counts
// them (semaphore); each GetAsyncEvent takes one.
struct AsyncEventResp {
  uint32_t event_type;  // ibv_event_type
  uint32_t handle;      // the object it is about: a QP, a CQ (IBV_EVENT_CQ_ERR) or an SRQ (IBV_EVENT_SRQ_*)
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
#undef DROCE_SHIM_OP

// Empty bodies are sent as zero bytes.
template <typename T> constexpr size_t body_size() {
  if constexpr (std::is_same_v<T, Empty>) return 0; else return sizeof(T);
}

}  // namespace droce::shim::proto
