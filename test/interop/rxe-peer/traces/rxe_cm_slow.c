/*
 * rxe_cm_slow - RDMA CM exchanges rdmacm-utils do not make, for the golden CM
 * capture (test/data/rxe-cm.pcap): a passive side that answers late (the
 * active side resends its REQ and Linux's ib_cm answers the duplicate with
 * MRA), private data in REQ, REP and REJ, and a consumer REJ.
 *
 * server: rxe_cm_slow -s ADDR -p PORT [-w SECONDS] [-r]
 *         waits SECONDS after CONNECT_REQUEST, then accepts with private data
 *         "rep-pdata" (or rejects with "rej-pdata" with -r)
 * client: rxe_cm_slow -c ADDR -p PORT
 *         connects with private data "req-pdata", disconnects once established
 * Build: gcc -O2 -Wall -o rxe_cm_slow rxe_cm_slow.c -lrdmacm -libverbs
 */
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want) {
  struct rdma_cm_event *ev;
  if (rdma_get_cm_event(ch, &ev)) {
    perror("rdma_get_cm_event");
    exit(1);
  }
  printf("event %s status %d\n", rdma_event_str(ev->event), ev->status);
  if (ev->event != want) {
    fprintf(stderr, "expected %s\n", rdma_event_str(want));
    exit(1);
  }
  return ev;
}

static void make_qp(struct rdma_cm_id *id) {
  struct ibv_qp_init_attr a = {0};
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.qp_type = IBV_QPT_RC;
  if (rdma_create_qp(id, NULL, &a)) {
    perror("rdma_create_qp");
    exit(1);
  }
}

int main(int argc, char **argv) {
  const char *addr = NULL, *port = "7180";
  int server = 0, wait_s = 0, reject = 0, o;
  while ((o = getopt(argc, argv, "s:c:p:w:r")) != -1) {
    switch (o) {
      case 's': server = 1; addr = optarg; break;
      case 'c': addr = optarg; break;
      case 'p': port = optarg; break;
      case 'w': wait_s = atoi(optarg); break;
      case 'r': reject = 1; break;
      default: fprintf(stderr, "usage: see the source\n"); return 2;
    }
  }
  if (!addr) return 2;
  struct addrinfo *ai;
  if (getaddrinfo(addr, port, NULL, &ai)) {
    fprintf(stderr, "getaddrinfo failed\n");
    return 1;
  }
  struct rdma_event_channel *ch = rdma_create_event_channel();
  struct rdma_cm_id *id;
  if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
    perror("rdma_create_id");
    return 1;
  }
  struct rdma_conn_param cp = {0};
  cp.responder_resources = 1;
  cp.initiator_depth = 1;
  cp.retry_count = 7;
  cp.rnr_retry_count = 7;
  struct rdma_cm_event *ev;
  if (server) {
    if (rdma_bind_addr(id, ai->ai_addr) || rdma_listen(id, 1)) {
      perror("listen");
      return 1;
    }
    ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    struct rdma_cm_id *cid = ev->id;
    printf("request private data: %.*s\n", (int)strnlen(ev->param.conn.private_data, ev->param.conn.private_data_len),
           (const char *)ev->param.conn.private_data);
    rdma_ack_cm_event(ev);
    sleep(wait_s);
    if (reject) {
      static const char pd[] = "rej-pdata";
      rdma_reject(cid, pd, sizeof pd);
      printf("rejected\n");
      return 0;
    }
    make_qp(cid);
    static const char pd[] = "rep-pdata";
    cp.private_data = pd;
    cp.private_data_len = sizeof pd;
    if (rdma_accept(cid, &cp)) {
      perror("rdma_accept");
      return 1;
    }
    rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ESTABLISHED));
    rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_DISCONNECTED));
    rdma_destroy_qp(cid);
    rdma_destroy_id(cid);
  } else {
    if (rdma_resolve_addr(id, NULL, ai->ai_addr, 2000)) return 1;
    rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    if (rdma_resolve_route(id, 2000)) return 1;
    rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
    make_qp(id);
    static const char pd[] = "req-pdata";
    cp.private_data = pd;
    cp.private_data_len = sizeof pd;
    if (rdma_connect(id, &cp)) {
      perror("rdma_connect");
      return 1;
    }
    if (rdma_get_cm_event(ch, &ev)) return 1;
    printf("event %s status %d\n", rdma_event_str(ev->event), ev->status);
    if (ev->param.conn.private_data_len)
      printf("reply private data: %.*s\n", (int)strnlen(ev->param.conn.private_data, ev->param.conn.private_data_len),
             (const char *)ev->param.conn.private_data);
    const int ok = ev->event == RDMA_CM_EVENT_ESTABLISHED;
    rdma_ack_cm_event(ev);
    if (!ok) return 3;
    rdma_disconnect(id);
    rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_DISCONNECTED));
    rdma_destroy_qp(id);
  }
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
  freeaddrinfo(ai);
  return 0;
}
