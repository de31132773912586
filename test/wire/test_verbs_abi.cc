// The work-request and QP-type enums of lib/wire carry the values of
// libibverbs (rdma-core 44), so the shim passes them through unchanged.
#include <catch2/catch.hpp>
#include <infiniband/verbs.h>

#include "wire/opcode.h"

using namespace droce::wire;

static_assert(static_cast<int>(WrOpcode::RdmaWrite) == IBV_WR_RDMA_WRITE);
static_assert(static_cast<int>(WrOpcode::RdmaWriteImm) == IBV_WR_RDMA_WRITE_WITH_IMM);
static_assert(static_cast<int>(WrOpcode::Send) == IBV_WR_SEND);
static_assert(static_cast<int>(WrOpcode::SendImm) == IBV_WR_SEND_WITH_IMM);
static_assert(static_cast<int>(WrOpcode::RdmaRead) == IBV_WR_RDMA_READ);
static_assert(static_cast<int>(WrOpcode::AtomicCmpSwp) == IBV_WR_ATOMIC_CMP_AND_SWP);
static_assert(static_cast<int>(WrOpcode::AtomicFetchAdd) == IBV_WR_ATOMIC_FETCH_AND_ADD);
static_assert(static_cast<int>(WrOpcode::LocalInv) == IBV_WR_LOCAL_INV);
static_assert(static_cast<int>(WrOpcode::BindMw) == IBV_WR_BIND_MW);
static_assert(static_cast<int>(WrOpcode::SendInv) == IBV_WR_SEND_WITH_INV);
static_assert(static_cast<int>(QpType::RC) == IBV_QPT_RC);
static_assert(static_cast<int>(QpType::UC) == IBV_QPT_UC);
static_assert(static_cast<int>(QpType::UD) == IBV_QPT_UD);

TEST_CASE("wire enums match libibverbs", "[wire][abi]") {
  CHECK(wr_allowed(static_cast<QpType>(IBV_QPT_UD), static_cast<WrOpcode>(IBV_WR_SEND_WITH_IMM)));
  CHECK_FALSE(wr_allowed(static_cast<QpType>(IBV_QPT_UC), static_cast<WrOpcode>(IBV_WR_RDMA_READ)));
}
