/* Compiled as C11: the ABI header must be plain C. Reports its sizes so the
 * C++ test can check both languages agree. */
#include "shim/droce_shm_abi.h"

struct droce_abi_sizes {
  unsigned long region_hdr, ring_hdr, send_wqe, recv_wqe, cqe, sge, off_cons, off_armed, off_sge;
};

void droce_abi_sizes_c(struct droce_abi_sizes* s);
void droce_abi_sizes_c(struct droce_abi_sizes* s) {
  s->region_hdr = sizeof(struct droce_shm_region_hdr);
  s->ring_hdr = sizeof(struct droce_shm_ring_hdr);
  s->send_wqe = sizeof(struct droce_shm_send_wqe);
  s->recv_wqe = sizeof(struct droce_shm_recv_wqe);
  s->cqe = sizeof(struct droce_shm_cqe);
  s->sge = sizeof(struct droce_shm_sge);
  s->off_cons = offsetof(struct droce_shm_ring_hdr, cons);
  s->off_armed = offsetof(struct droce_shm_ring_hdr, armed);
  s->off_sge = offsetof(struct droce_shm_send_wqe, u);
}
