// The provider-facing entry points of rdma-core 44 (IBVERBS_PRIVATE_34) and
// the kernel-ABI conversion helpers. Programs such as perftest link the
// direct-verbs provider libraries (libmlx5, libefa) and librdmacm, which
// import these symbols, so the front must export them for those programs to
// load at all. droce has no kernel uverbs device, so no provider ever gets a
// device to drive: the registration call is accepted and ignored, and the
// kernel command helpers are unreachable. If one is reached anyway it says
// so on stderr and aborts instead of returning a value its caller would
// misread.
#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define DROCE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
[[noreturn]] void unreachable(const char* name) {
  std::fprintf(stderr, "droce libibverbs: %s called: droce has no kernel verbs device for a provider to drive\n", name);
  std::abort();
}
}  // namespace

// Read by providers when a device is disassociated; droce never does that.
extern "C" {
__attribute__((visibility("default"))) bool verbs_allow_disassociate_destroy = false;
}

struct verbs_device_ops;
// A provider library's constructor registers its driver; no droce device
// matches a kernel provider, so there is nothing to record.
DROCE_EXPORT void verbs_register_driver_34(const verbs_device_ops*) {}

DROCE_EXPORT void __verbs_log(void*, uint32_t, const char*, ...) {}

DROCE_EXPORT int ibv_read_ibdev_sysfs_file(char*, size_t, const char*, const char*, ...) { return -1; }

// The kernel's structs to libibverbs' (used by librdmacm).
DROCE_EXPORT void ibv_copy_ah_attr_from_kern(ibv_ah_attr* dst, const ib_uverbs_ah_attr* src) {
  std::memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof(dst->grh.dgid));
  dst->grh.flow_label = src->grh.flow_label;
  dst->grh.sgid_index = src->grh.sgid_index;
  dst->grh.hop_limit = src->grh.hop_limit;
  dst->grh.traffic_class = src->grh.traffic_class;
  dst->dlid = src->dlid;
  dst->sl = src->sl;
  dst->src_path_bits = src->src_path_bits;
  dst->static_rate = src->static_rate;
  dst->is_global = src->is_global;
  dst->port_num = src->port_num;
}

DROCE_EXPORT void ibv_copy_qp_attr_from_kern(ibv_qp_attr* dst, const ib_uverbs_qp_attr* src) {
  dst->cur_qp_state = static_cast<ibv_qp_state>(src->cur_qp_state);
  dst->path_mtu = static_cast<ibv_mtu>(src->path_mtu);
  dst->path_mig_state = static_cast<ibv_mig_state>(src->path_mig_state);
  dst->qkey = src->qkey;
  dst->rq_psn = src->rq_psn;
  dst->sq_psn = src->sq_psn;
  dst->dest_qp_num = src->dest_qp_num;
  dst->qp_access_flags = static_cast<int>(src->qp_access_flags);
  dst->cap.max_send_wr = src->max_send_wr;
  dst->cap.max_recv_wr = src->max_recv_wr;
  dst->cap.max_send_sge = src->max_send_sge;
  dst->cap.max_recv_sge = src->max_recv_sge;
  dst->cap.max_inline_data = src->max_inline_data;
  ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
  ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);
  dst->pkey_index = src->pkey_index;
  dst->alt_pkey_index = src->alt_pkey_index;
  dst->en_sqd_async_notify = src->en_sqd_async_notify;
  dst->sq_draining = src->sq_draining;
  dst->max_rd_atomic = src->max_rd_atomic;
  dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
  dst->min_rnr_timer = src->min_rnr_timer;
  dst->port_num = src->port_num;
  dst->timeout = src->timeout;
  dst->retry_cnt = src->retry_cnt;
  dst->rnr_retry = src->rnr_retry;
  dst->alt_port_num = src->alt_port_num;
  dst->alt_timeout = src->alt_timeout;
}

DROCE_EXPORT void ibv_copy_path_rec_from_kern(ibv_sa_path_rec* dst, const ib_user_path_rec* src) {
  std::memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid));
  std::memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid));
  dst->dlid = src->dlid;
  dst->slid = src->slid;
  dst->raw_traffic = static_cast<int>(src->raw_traffic);
  dst->flow_label = src->flow_label;
  dst->reversible = static_cast<int>(src->reversible);
  dst->mtu = static_cast<uint8_t>(src->mtu);
  dst->pkey = src->pkey;
  dst->hop_limit = src->hop_limit;
  dst->traffic_class = src->traffic_class;
  dst->numb_path = src->numb_path;
  dst->sl = src->sl;
  dst->mtu_selector = src->mtu_selector;
  dst->rate_selector = src->rate_selector;
  dst->rate = src->rate;
  dst->packet_life_time_selector = src->packet_life_time_selector;
  dst->packet_life_time = src->packet_life_time;
  dst->preference = src->preference;
}

DROCE_EXPORT void ibv_copy_path_rec_to_kern(ib_user_path_rec* dst, const ibv_sa_path_rec* src) {
  std::memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
  std::memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));
  dst->dlid = src->dlid;
  dst->slid = src->slid;
  dst->raw_traffic = static_cast<uint32_t>(src->raw_traffic);
  dst->flow_label = src->flow_label;
  dst->reversible = static_cast<uint32_t>(src->reversible);
  dst->mtu = src->mtu;
  dst->pkey = src->pkey;
  dst->hop_limit = src->hop_limit;
  dst->traffic_class = src->traffic_class;
  dst->numb_path = src->numb_path;
  dst->sl = src->sl;
  dst->mtu_selector = src->mtu_selector;
  dst->rate_selector = src->rate_selector;
  dst->rate = src->rate;
  dst->packet_life_time_selector = src->packet_life_time_selector;
  dst->packet_life_time = src->packet_life_time;
  dst->preference = src->preference;
}

// Resolving a GID to a MAC is droced's job (its neighbour table), not the
// client's.
DROCE_EXPORT int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, uint8_t*, uint16_t*) {
  errno = EOPNOTSUPP;
  return -1;
}

// Kernel command helpers for providers: unreachable without a kernel device.
DROCE_EXPORT void __ioctl_final_num_attrs() { unreachable("__ioctl_final_num_attrs"); }
DROCE_EXPORT void _verbs_init_and_alloc_context() { unreachable("_verbs_init_and_alloc_context"); }
DROCE_EXPORT void execute_ioctl() { unreachable("execute_ioctl"); }
DROCE_EXPORT void ibv_cmd_advise_mr() { unreachable("ibv_cmd_advise_mr"); }
DROCE_EXPORT void ibv_cmd_alloc_dm() { unreachable("ibv_cmd_alloc_dm"); }
DROCE_EXPORT void ibv_cmd_alloc_mw() { unreachable("ibv_cmd_alloc_mw"); }
DROCE_EXPORT void ibv_cmd_alloc_pd() { unreachable("ibv_cmd_alloc_pd"); }
DROCE_EXPORT void ibv_cmd_attach_mcast() { unreachable("ibv_cmd_attach_mcast"); }
DROCE_EXPORT void ibv_cmd_close_xrcd() { unreachable("ibv_cmd_close_xrcd"); }
DROCE_EXPORT void ibv_cmd_create_ah() { unreachable("ibv_cmd_create_ah"); }
DROCE_EXPORT void ibv_cmd_create_counters() { unreachable("ibv_cmd_create_counters"); }
DROCE_EXPORT void ibv_cmd_create_cq() { unreachable("ibv_cmd_create_cq"); }
DROCE_EXPORT void ibv_cmd_create_cq_ex() { unreachable("ibv_cmd_create_cq_ex"); }
DROCE_EXPORT void ibv_cmd_create_flow() { unreachable("ibv_cmd_create_flow"); }
DROCE_EXPORT void ibv_cmd_create_flow_action_esp() { unreachable("ibv_cmd_create_flow_action_esp"); }
DROCE_EXPORT void ibv_cmd_create_qp() { unreachable("ibv_cmd_create_qp"); }
DROCE_EXPORT void ibv_cmd_create_qp_ex() { unreachable("ibv_cmd_create_qp_ex"); }
DROCE_EXPORT void ibv_cmd_create_qp_ex2() { unreachable("ibv_cmd_create_qp_ex2"); }
DROCE_EXPORT void ibv_cmd_create_rwq_ind_table() { unreachable("ibv_cmd_create_rwq_ind_table"); }
DROCE_EXPORT void ibv_cmd_create_srq() { unreachable("ibv_cmd_create_srq"); }
DROCE_EXPORT void ibv_cmd_create_srq_ex() { unreachable("ibv_cmd_create_srq_ex"); }
DROCE_EXPORT void ibv_cmd_create_wq() { unreachable("ibv_cmd_create_wq"); }
DROCE_EXPORT void ibv_cmd_dealloc_mw() { unreachable("ibv_cmd_dealloc_mw"); }
DROCE_EXPORT void ibv_cmd_dealloc_pd() { unreachable("ibv_cmd_dealloc_pd"); }
DROCE_EXPORT void ibv_cmd_dereg_mr() { unreachable("ibv_cmd_dereg_mr"); }
DROCE_EXPORT void ibv_cmd_destroy_ah() { unreachable("ibv_cmd_destroy_ah"); }
DROCE_EXPORT void ibv_cmd_destroy_counters() { unreachable("ibv_cmd_destroy_counters"); }
DROCE_EXPORT void ibv_cmd_destroy_cq() { unreachable("ibv_cmd_destroy_cq"); }
DROCE_EXPORT void ibv_cmd_destroy_flow() { unreachable("ibv_cmd_destroy_flow"); }
DROCE_EXPORT void ibv_cmd_destroy_flow_action() { unreachable("ibv_cmd_destroy_flow_action"); }
DROCE_EXPORT void ibv_cmd_destroy_qp() { unreachable("ibv_cmd_destroy_qp"); }
DROCE_EXPORT void ibv_cmd_destroy_rwq_ind_table() { unreachable("ibv_cmd_destroy_rwq_ind_table"); }
DROCE_EXPORT void ibv_cmd_destroy_srq() { unreachable("ibv_cmd_destroy_srq"); }
DROCE_EXPORT void ibv_cmd_destroy_wq() { unreachable("ibv_cmd_destroy_wq"); }
DROCE_EXPORT void ibv_cmd_detach_mcast() { unreachable("ibv_cmd_detach_mcast"); }
DROCE_EXPORT void ibv_cmd_free_dm() { unreachable("ibv_cmd_free_dm"); }
DROCE_EXPORT void ibv_cmd_get_context() { unreachable("ibv_cmd_get_context"); }
DROCE_EXPORT void ibv_cmd_modify_cq() { unreachable("ibv_cmd_modify_cq"); }
DROCE_EXPORT void ibv_cmd_modify_flow_action_esp() { unreachable("ibv_cmd_modify_flow_action_esp"); }
DROCE_EXPORT void ibv_cmd_modify_qp() { unreachable("ibv_cmd_modify_qp"); }
DROCE_EXPORT void ibv_cmd_modify_qp_ex() { unreachable("ibv_cmd_modify_qp_ex"); }
DROCE_EXPORT void ibv_cmd_modify_srq() { unreachable("ibv_cmd_modify_srq"); }
DROCE_EXPORT void ibv_cmd_modify_wq() { unreachable("ibv_cmd_modify_wq"); }
DROCE_EXPORT void ibv_cmd_open_qp() { unreachable("ibv_cmd_open_qp"); }
DROCE_EXPORT void ibv_cmd_open_xrcd() { unreachable("ibv_cmd_open_xrcd"); }
DROCE_EXPORT void ibv_cmd_poll_cq() { unreachable("ibv_cmd_poll_cq"); }
DROCE_EXPORT void ibv_cmd_post_recv() { unreachable("ibv_cmd_post_recv"); }
DROCE_EXPORT void ibv_cmd_post_send() { unreachable("ibv_cmd_post_send"); }
DROCE_EXPORT void ibv_cmd_post_srq_recv() { unreachable("ibv_cmd_post_srq_recv"); }
DROCE_EXPORT void ibv_cmd_query_context() { unreachable("ibv_cmd_query_context"); }
DROCE_EXPORT void ibv_cmd_query_device_any() { unreachable("ibv_cmd_query_device_any"); }
DROCE_EXPORT void ibv_cmd_query_mr() { unreachable("ibv_cmd_query_mr"); }
DROCE_EXPORT void ibv_cmd_query_port() { unreachable("ibv_cmd_query_port"); }
DROCE_EXPORT void ibv_cmd_query_qp() { unreachable("ibv_cmd_query_qp"); }
DROCE_EXPORT void ibv_cmd_query_srq() { unreachable("ibv_cmd_query_srq"); }
DROCE_EXPORT void ibv_cmd_read_counters() { unreachable("ibv_cmd_read_counters"); }
DROCE_EXPORT void ibv_cmd_reg_dm_mr() { unreachable("ibv_cmd_reg_dm_mr"); }
DROCE_EXPORT void ibv_cmd_reg_dmabuf_mr() { unreachable("ibv_cmd_reg_dmabuf_mr"); }
DROCE_EXPORT void ibv_cmd_reg_mr() { unreachable("ibv_cmd_reg_mr"); }
DROCE_EXPORT void ibv_cmd_req_notify_cq() { unreachable("ibv_cmd_req_notify_cq"); }
DROCE_EXPORT void ibv_cmd_rereg_mr() { unreachable("ibv_cmd_rereg_mr"); }
DROCE_EXPORT void ibv_cmd_resize_cq() { unreachable("ibv_cmd_resize_cq"); }
DROCE_EXPORT void verbs_init_cq() { unreachable("verbs_init_cq"); }
DROCE_EXPORT void verbs_open_device() { unreachable("verbs_open_device"); }
DROCE_EXPORT void verbs_set_ops() { unreachable("verbs_set_ops"); }
DROCE_EXPORT void verbs_uninit_context() { unreachable("verbs_uninit_context"); }
