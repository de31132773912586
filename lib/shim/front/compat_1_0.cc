// IBVERBS_1.0 entry points for the symbols that rdma-core exports in two
// versions (1.0 and 1.1). Programs linked against libibverbs 1.0 (2006) see
// different structs: a device list of ibv_device_1_0 wrappers and a
// context whose ops table is the old one. Here: the device and context
// level calls (list, name, GUID, open, close, query device/port/GID/P_Key),
// bound to their 1.0 versions with .symver while the same names keep their
// default 1.1 versions in verbs_front.cc. The 1.0 PD/MR/CQ/QP calls are not
// provided, so a 1.0 program that needs them fails at load time with a
// missing-version error rather than misbehaving.
#include <infiniband/verbs.h>

#include <cstdlib>

#undef ibv_get_device_list
#undef ibv_query_port

#define DROCE_COMPAT(impl, name) \
  __asm__(".symver " #impl "," #name "@IBVERBS_1.0"); \
  extern "C" __attribute__((visibility("default")))

namespace {
// The 1.0 layouts (rdma-core libibverbs/compat-1_0.c).
struct ibv_device_1_0 {
  void* obsolete_sysfs_dev;
  void* obsolete_sysfs_ibdev;
  ibv_device* real_device;
  _ibv_device_ops ops;
};
struct ibv_context_ops_1_0 {
  void* fn[28];  // query_device ... detach_mcast; the 1.0 data-path ops are not offered
};
struct ibv_context_1_0 {
  ibv_device_1_0* device;
  ibv_context_ops_1_0 ops;
  int cmd_fd;
  int async_fd;
  int num_comp_vectors;
  ibv_context* real_context;
};
}  // namespace

DROCE_COMPAT(droce_get_device_list_1_0, ibv_get_device_list)
ibv_device_1_0** droce_get_device_list_1_0(int* num) {
  int n = 0;
  ibv_device** real = ibv_get_device_list(&n);
  if (real == nullptr) return nullptr;
  // Slot 0 keeps the real list for the free call; the caller sees slot 1 on.
  auto** l = static_cast<ibv_device_1_0**>(calloc(static_cast<size_t>(n) + 2, sizeof(ibv_device_1_0*)));
  if (l == nullptr) {
    ibv_free_device_list(real);
    return nullptr;
  }
  l[0] = reinterpret_cast<ibv_device_1_0*>(real);
  for (int i = 0; i < n; i++) {
    l[i + 1] = static_cast<ibv_device_1_0*>(calloc(1, sizeof(ibv_device_1_0)));
    if (l[i + 1] == nullptr) {
      for (int k = 1; k <= i; k++) free(l[k]);
      free(l);
      ibv_free_device_list(real);
      return nullptr;
    }
    l[i + 1]->real_device = real[i];
  }
  if (num) *num = n;
  return l + 1;
}

DROCE_COMPAT(droce_free_device_list_1_0, ibv_free_device_list)
void droce_free_device_list_1_0(ibv_device_1_0** list) {
  for (ibv_device_1_0** l = list; *l != nullptr; l++) free(*l);
  ibv_free_device_list(reinterpret_cast<ibv_device**>(list[-1]));
  free(list - 1);
}

DROCE_COMPAT(droce_get_device_name_1_0, ibv_get_device_name)
const char* droce_get_device_name_1_0(ibv_device_1_0* d) { return ibv_get_device_name(d->real_device); }

DROCE_COMPAT(droce_get_device_guid_1_0, ibv_get_device_guid)
__be64 droce_get_device_guid_1_0(ibv_device_1_0* d) { return ibv_get_device_guid(d->real_device); }

DROCE_COMPAT(droce_open_device_1_0, ibv_open_device)
ibv_context_1_0* droce_open_device_1_0(ibv_device_1_0* d) {
  auto* c = static_cast<ibv_context_1_0*>(calloc(1, sizeof(ibv_context_1_0)));
  if (c == nullptr) return nullptr;
  c->real_context = ibv_open_device(d->real_device);
  if (c->real_context == nullptr) {
    free(c);
    return nullptr;
  }
  c->device = d;
  c->cmd_fd = c->real_context->cmd_fd;
  c->async_fd = c->real_context->async_fd;
  c->num_comp_vectors = c->real_context->num_comp_vectors;
  return c;
}

DROCE_COMPAT(droce_close_device_1_0, ibv_close_device)
int droce_close_device_1_0(ibv_context_1_0* c) {
  int rc = ibv_close_device(c->real_context);
  if (rc == 0) free(c);
  return rc;
}

DROCE_COMPAT(droce_query_device_1_0, ibv_query_device)
int droce_query_device_1_0(ibv_context_1_0* c, ibv_device_attr* a) { return ibv_query_device(c->real_context, a); }

DROCE_COMPAT(droce_query_port_1_0, ibv_query_port)
int droce_query_port_1_0(ibv_context_1_0* c, uint8_t port, _compat_ibv_port_attr* a) {
  return ibv_query_port(c->real_context, port, a);
}

DROCE_COMPAT(droce_query_gid_1_0, ibv_query_gid)
int droce_query_gid_1_0(ibv_context_1_0* c, uint8_t port, int index, ibv_gid* gid) {
  return ibv_query_gid(c->real_context, port, index, gid);
}

DROCE_COMPAT(droce_query_pkey_1_0, ibv_query_pkey)
int droce_query_pkey_1_0(ibv_context_1_0* c, uint8_t port, int index, __be16* pkey) {
  return ibv_query_pkey(c->real_context, port, index, pkey);
}
