#pragma once
// Mixed-precision helpers shared by the trainer and the model code (private: LibTorch types).
#include <torch/torch.h>
#include <torch/version.h>

#include <ATen/autocast_mode.h>

namespace lathe::core {

/// Autocast on for a scope, like `with torch.autocast(device, dtype)`. The previous state is
/// restored and the cast cache cleared on exit. Autocast state is thread-local.
class AutocastGuard {
public:
    AutocastGuard(c10::DeviceType device, c10::ScalarType dtype) : m_device(device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
        m_prevEnabled = at::autocast::is_autocast_enabled(device);
        m_prevDtype = at::autocast::get_autocast_dtype(device);
        at::autocast::set_autocast_enabled(device, true);
        at::autocast::set_autocast_dtype(device, dtype);
#else
        if (device == c10::DeviceType::CPU) {
            m_prevEnabled = at::autocast::is_cpu_enabled();
            m_prevDtype = at::autocast::get_autocast_cpu_dtype();
            at::autocast::set_cpu_enabled(true);
            at::autocast::set_autocast_cpu_dtype(dtype);
        } else {
            m_prevEnabled = at::autocast::is_enabled();
            m_prevDtype = at::autocast::get_autocast_gpu_dtype();
            at::autocast::set_enabled(true);
            at::autocast::set_autocast_gpu_dtype(dtype);
        }
#endif
        at::autocast::increment_nesting();
    }
    ~AutocastGuard() {
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
        at::autocast::set_autocast_enabled(m_device, m_prevEnabled);
        at::autocast::set_autocast_dtype(m_device, m_prevDtype);
#else
        if (m_device == c10::DeviceType::CPU) {
            at::autocast::set_cpu_enabled(m_prevEnabled);
            at::autocast::set_autocast_cpu_dtype(m_prevDtype);
        } else {
            at::autocast::set_enabled(m_prevEnabled);
            at::autocast::set_autocast_gpu_dtype(m_prevDtype);
        }
#endif
    }
    AutocastGuard(const AutocastGuard&) = delete;
    AutocastGuard& operator=(const AutocastGuard&) = delete;

private:
    c10::DeviceType m_device;
    bool m_prevEnabled = false;
    c10::ScalarType m_prevDtype = c10::ScalarType::Float;
};

}  // namespace lathe::core
