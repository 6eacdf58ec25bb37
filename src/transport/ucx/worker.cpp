#include "transport/ucx/worker.hpp"

#include <uct/api/uct.h>

#include <algorithm>
#include <cstdlib>
#include <initializer_list>

#include "base/config.hpp"

namespace anview::transport::ucx {
namespace {

DeviceReport query_devices() {
  DeviceReport report;
  uct_component_h* components = nullptr;
  unsigned component_count = 0;
  ucs_status_t status = uct_query_components(&components, &component_count);
  if (status != UCS_OK) {
    report.error = "uct_query_components: " + status_text(status);
    return report;
  }
  for (unsigned c = 0; c < component_count; ++c) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    for (const auto& md_resource : mds) {
      uct_md_config_t* config = nullptr;
      if (uct_md_config_read(components[c], nullptr, nullptr, &config) != UCS_OK) continue;
      uct_md_h md = nullptr;
      status = uct_md_open(components[c], md_resource.md_name, config, &md);
      uct_config_release(config);
      if (status != UCS_OK) continue;
      uct_tl_resource_desc_t* tls = nullptr;
      unsigned tl_count = 0;
      if (uct_md_query_tl_resources(md, &tls, &tl_count) == UCS_OK) {
        for (unsigned t = 0; t < tl_count; ++t) {
          const std::string tl = tls[t].tl_name;
          const std::string entry = tl + "/" + tls[t].dev_name;
          (is_rdma_transport(tl) ? report.rdma : report.other).push_back(entry);
        }
        uct_release_tl_resource_list(tls);
      }
      uct_md_close(md);
    }
  }
  uct_release_component_list(components);
  return report;
}

}  // namespace

const DeviceReport& devices() {
  static const DeviceReport report = query_devices();
  return report;
}

bool is_rdma_transport(const std::string& tl_name) {
  return tl_name.rfind("rc", 0) == 0 || tl_name.rfind("dc", 0) == 0 || tl_name.rfind("ud", 0) == 0;
}

namespace {

// `groups`: UCX's names for the whole kind ("sm"); `member`: whether a transport is of it.
bool tls_allows(const std::string& tls, std::initializer_list<const char*> groups,
                bool (*member)(const std::string&)) {
  const bool excluding = !tls.empty() && tls[0] == '^';  // "^tcp": all but these
  const auto names = base::split_list(excluding ? tls.substr(1) : tls);
  auto is_group = [&](const std::string& n) {
    return std::any_of(groups.begin(), groups.end(), [&](const char* g) { return n == g; });
  };
  if (excluding) return std::none_of(names.begin(), names.end(), is_group);
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& n) { return n == "all" || is_group(n) || member(n); });
}

bool is_shared_memory_transport(const std::string& name) {
  return name == "posix" || name == "sysv" || name == "cma" || name == "knem" || name == "xpmem";
}

}  // namespace

bool tls_allows_shared_memory(const std::string& tls) {
  return tls_allows(tls, {"sm", "shm"}, is_shared_memory_transport);
}

bool tls_allows_rdma(const std::string& tls) {
  return tls_allows(tls, {"ib"}, is_rdma_transport);
}

std::string status_text(ucs_status_t status) {
  std::string name = ucs_status_string(status);
  return name + " (" + std::to_string(static_cast<int>(status)) + ")";
}

Worker::Worker() {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) {
    error_ = "ucp_config_read: " + status_text(status);
    return;
  }
  if (const char* tls = std::getenv("UCX_TLS"); tls != nullptr && *tls != '\0') tls_ = tls;
  // A dead peer on a fabric without a connection to break (rc, ud) is found by UCX's
  // keepalive; its default (20 s) is far from "about a second". The user's setting wins.
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr)
    ucp_config_modify(config, "KEEPALIVE_INTERVAL", "1s");
  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | UCP_FEATURE_RMA;
  params.mt_workers_shared = 0;
  params.name = "anview";
  status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (status != UCS_OK) {
    context_ = nullptr;
    error_ = "ucp_init: " + status_text(status);
    return;
  }
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h worker = nullptr;
  status = ucp_worker_create(context_, &worker_params, &worker);
  if (status != UCS_OK) {
    error_ = "ucp_worker_create: " + status_text(status);
    return;
  }
  status = ucp_worker_get_efd(worker, &event_fd_);
  if (status != UCS_OK) {
    error_ = "ucp_worker_get_efd: " + status_text(status);
    ucp_worker_destroy(worker);
    return;
  }
  ucp_address_t* address = nullptr;
  std::size_t address_bytes = 0;
  status = ucp_worker_get_address(worker, &address, &address_bytes);
  if (status != UCS_OK) {
    error_ = "ucp_worker_get_address: " + status_text(status);
    ucp_worker_destroy(worker);
    return;
  }
  address_.assign(reinterpret_cast<const char*>(address), address_bytes);
  ucp_worker_release_address(worker, address);
  worker_ = worker;
}

Worker::~Worker() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

}  // namespace anview::transport::ucx
