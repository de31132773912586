// One instance of every CM message with distinct, non-trivial values in every
// field (bit fields near their maximum, multi-byte fields with different
// bytes), shared by the codec tests, the Wireshark check and cm_pcap.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cm/cma.h"
#include "cm/mad.h"
#include "wire/headers.h"

namespace droce::cm::samples {

inline constexpr uint32_t kIpA = 0xC0A80701;  // 192.168.7.1: the REQ's sender
inline constexpr uint32_t kIpB = 0xC0A80702;  // 192.168.7.2
inline constexpr uint16_t kTcpPort = 18515;
inline constexpr uint16_t kUdpPort = 7471;

template <size_t N>
void pattern(uint8_t (&d)[N], uint8_t seed) {
  for (size_t i = 0; i < N; ++i) d[i] = static_cast<uint8_t>(seed + i * 7);
}

inline Req req() {
  Req m;
  m.local_comm_id = 0xA1B2C3D4;
  m.service_id = service_id(PortSpace::Tcp, kTcpPort);
  m.local_ca_guid = 0x021122FFFE334455ull;
  m.local_qkey = 0x12345678;
  m.local_qpn = 0xABCDEF;
  m.responder_resources = 0x10;
  m.initiator_depth = 0x20;
  m.remote_cm_response_timeout = 0x15;
  m.transport = CmTransport::Uc;
  m.end_to_end_flow_control = true;
  m.starting_psn = 0x654321;
  m.local_cm_response_timeout = 0x0A;
  m.retry_count = 5;
  m.pkey = 0x8001;
  m.path_mtu = 5;
  m.rdc_exists = true;
  m.rnr_retry_count = 6;
  m.max_cm_retries = 9;
  m.srq = false;
  m.extended_transport = 7;
  m.primary.local_lid = 0xFFFF;
  m.primary.remote_lid = 0xFFFE;
  m.primary.local_gid = wire::gid_from_ipv4(kIpA);
  m.primary.remote_gid = wire::gid_from_ipv4(kIpB);
  m.primary.flow_label = 0xABCDE;
  m.primary.packet_rate = 0x2A;
  m.primary.traffic_class = 0xB8;
  m.primary.hop_limit = 0x40;
  m.primary.sl = 12;
  m.primary.subnet_local = true;
  m.primary.local_ack_timeout = 0x13;
  // Private data as RDMA CM sends it: the CMA header, then the program's bytes.
  pattern(m.private_data, 0x31);
  CmaHdr c;
  c.ip_version = 4;
  c.src_port = 0xC123;
  c.src = wire::gid_from_ipv4(kIpA);
  c.dst = wire::gid_from_ipv4(kIpB);
  encode_cma_hdr(m.private_data, c);
  return m;
}

// The REQ with an alternate path (its own LIDs, GIDs reversed, other values).
inline Req req_alt() {
  Req m = req();
  m.has_alternate = true;
  m.alternate.local_lid = 0x0102;
  m.alternate.remote_lid = 0x0304;
  m.alternate.local_gid = wire::gid_from_ipv4(kIpB);
  m.alternate.remote_gid = wire::gid_from_ipv4(kIpA);
  m.alternate.flow_label = 0x12345;
  m.alternate.packet_rate = 0x3F;
  m.alternate.traffic_class = 0x04;
  m.alternate.hop_limit = 0xFF;
  m.alternate.sl = 3;
  m.alternate.subnet_local = false;
  m.alternate.local_ack_timeout = 0x1F;
  return m;
}

inline Mra mra() {
  Mra m;
  m.local_comm_id = 0x0A0B0C0D;
  m.remote_comm_id = 0xB0000001;
  m.message_mraed = 2;
  m.service_timeout = 0x15;
  pattern(m.private_data, 0x42);
  return m;
}

inline Rej rej() {
  Rej m;
  m.local_comm_id = 0x0A0B0C0D;
  m.remote_comm_id = 0xA1B2C3D4;
  m.message_rejected = 1;
  m.ari_length = 7;
  m.reason = static_cast<uint16_t>(RejReason::ConsumerDefined);
  pattern(m.ari, 0x53);
  pattern(m.private_data, 0x64);
  return m;
}

inline Rep rep() {
  Rep m;
  m.local_comm_id = 0x0A0B0C0D;
  m.remote_comm_id = 0xA1B2C3D4;
  m.local_qkey = 0x01234567;
  m.local_qpn = 0x000123;
  m.local_eecn = 0xEEEEEE;
  m.starting_psn = 0x0FFFFE;
  m.responder_resources = 4;
  m.initiator_depth = 8;
  m.target_ack_delay = 0x11;
  m.failover_accepted = 2;
  m.end_to_end_flow_control = true;
  m.rnr_retry_count = 6;
  m.srq = true;
  m.local_ca_guid = 0x02AABBCCDDEEFF66ull;
  pattern(m.private_data, 0x75);
  return m;
}

inline Rtu rtu() {
  Rtu m;
  m.local_comm_id = 0xA1B2C3D4;
  m.remote_comm_id = 0x0A0B0C0D;
  pattern(m.private_data, 0x86);
  return m;
}

inline Dreq dreq() {
  Dreq m;
  m.local_comm_id = 0xA1B2C3D4;
  m.remote_comm_id = 0x0A0B0C0D;
  m.remote_qpn = 0x00ABCD;
  pattern(m.private_data, 0x97);
  return m;
}

inline Drep drep() {
  Drep m;
  m.local_comm_id = 0x11223344;
  m.remote_comm_id = 0x55667788;
  pattern(m.private_data, 0xA8);
  return m;
}

inline SidrReq sidr_req() {
  SidrReq m;
  m.request_id = 0x5151A0A0;
  m.pkey = 0x7FFF;
  m.service_id = service_id(PortSpace::Udp, kUdpPort);
  pattern(m.private_data, 0xB9);
  CmaHdr c;
  c.ip_version = 4;
  c.src_port = 0xC124;
  c.src = wire::gid_from_ipv4(kIpA);
  c.dst = wire::gid_from_ipv4(kIpB);
  encode_cma_hdr(m.private_data, c);
  return m;
}

inline SidrRep sidr_rep() {
  SidrRep m;
  m.request_id = 0x5151A0A0;
  m.status = static_cast<uint8_t>(SidrStatus::Reject);
  m.add_info_length = 5;
  m.qpn = 0x0000C0;
  m.service_id = service_id(PortSpace::Udp, kUdpPort);
  m.qkey = kUdpQkey;
  pattern(m.add_info, 0xCA);
  pattern(m.private_data, 0xDB);
  return m;
}

}  // namespace droce::cm::samples
