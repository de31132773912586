/* idle_qps DEVICE N: opens DEVICE through libibverbs (the drop-in, by
 * LD_LIBRARY_PATH), creates N RC QPs (one PD, one CQ) and keeps them open
 * and idle until it gets SIGTERM / SIGINT or 10 minutes pass. Prints
 * "ready N" when they exist. For the shim benchmark's poller cost with idle
 * QPs (bench_shim_memif.sh, BENCH_IDLE_QPS). */
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void on_signal(int s) {
  (void)s;
  stop = 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: idle_qps DEVICE N\n");
    return 2;
  }
  const int n = atoi(argv[2]);
  int num = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  struct ibv_device* dev = NULL;
  for (int i = 0; list && i < num; i++)
    if (strcmp(ibv_get_device_name(list[i]), argv[1]) == 0) dev = list[i];
  if (dev == NULL) {
    fprintf(stderr, "idle_qps: no device %s\n", argv[1]);
    return 1;
  }
  struct ibv_context* ctx = ibv_open_device(dev);
  struct ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : NULL;
  struct ibv_cq* cq = pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
  if (cq == NULL) {
    fprintf(stderr, "idle_qps: open / PD / CQ failed\n");
    return 1;
  }
  struct ibv_qp** qps = calloc((size_t)(n > 0 ? n : 1), sizeof(*qps));
  for (int i = 0; i < n; i++) {
    struct ibv_qp_init_attr a;
    memset(&a, 0, sizeof(a));
    a.send_cq = cq;
    a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = 16;
    a.cap.max_recv_wr = 16;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    qps[i] = ibv_create_qp(pd, &a);
    if (qps[i] == NULL) {
      fprintf(stderr, "idle_qps: QP %d of %d failed\n", i, n);
      return 1;
    }
  }
  printf("ready %d\n", n);
  fflush(stdout);
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  for (int t = 0; t < 6000 && !stop; t++) usleep(100000); /* bounded: 10 minutes */
  for (int i = 0; i < n; i++) ibv_destroy_qp(qps[i]);
  free(qps);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}
