/* Calls the IBVERBS_1.0 versions of the device-level verbs (as a program
 * linked against libibverbs 1.0 would) and their default 1.1 versions, in
 * one process, against the front; prints what it saw, exits 0 on success. */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

#undef ibv_get_device_list

__asm__(".symver v10_get_device_list,ibv_get_device_list@IBVERBS_1.0");
__asm__(".symver v10_free_device_list,ibv_free_device_list@IBVERBS_1.0");
__asm__(".symver v10_get_device_name,ibv_get_device_name@IBVERBS_1.0");
__asm__(".symver v10_open_device,ibv_open_device@IBVERBS_1.0");
__asm__(".symver v10_query_device,ibv_query_device@IBVERBS_1.0");
__asm__(".symver v10_query_gid,ibv_query_gid@IBVERBS_1.0");
__asm__(".symver v10_close_device,ibv_close_device@IBVERBS_1.0");
void** v10_get_device_list(int* num);
void v10_free_device_list(void** list);
const char* v10_get_device_name(void* dev);
void* v10_open_device(void* dev);
int v10_query_device(void* ctx, struct ibv_device_attr* attr);
int v10_query_gid(void* ctx, uint8_t port, int index, union ibv_gid* gid);
int v10_close_device(void* ctx);

int main(void) {
  int n = 0;
  void** l = v10_get_device_list(&n);
  if (l == NULL || n != 1) return 1;
  const char* name = v10_get_device_name(l[0]);
  void* ctx = v10_open_device(l[0]);
  struct ibv_device_attr a;
  union ibv_gid g;
  memset(&a, 0, sizeof(a));
  if (ctx == NULL || v10_query_device(ctx, &a) != 0 || v10_query_gid(ctx, 1, 1, &g) != 0) return 2;
  printf("1.0: %s vendor 0x%x gid[1] ends %u.%u.%u.%u\n", name, a.vendor_id, g.raw[12], g.raw[13], g.raw[14],
         g.raw[15]);
  if (v10_close_device(ctx) != 0) return 3;
  v10_free_device_list(l);
  /* The default (1.1) versions in the same process. */
  struct ibv_device** l11 = ibv_get_device_list(&n);
  if (l11 == NULL || n != 1 || strcmp(ibv_get_device_name(l11[0]), name) != 0) return 4;
  struct ibv_context* c = ibv_open_device(l11[0]);
  if (c == NULL || ibv_query_device(c, &a) != 0 || a.vendor_id != 0xffffff) return 5;
  ibv_close_device(c);
  ibv_free_device_list(l11);
  printf("1.1: %s vendor 0x%x\n", name, a.vendor_id);
  return 0;
}
