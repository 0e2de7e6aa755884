//! Which of burn's CPU backends runs the model. burn 0.22 picks the backend from the device, so
//! the model's code is the same on every backend.

use burn_tensor::Device;

/// A burn backend compiled into this example.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// burn-ndarray: the CPU backend burn's model ports have used (deprecated in burn 0.22).
    NdArray,
    /// burn-flex: burn 0.22's pure-Rust CPU backend, NdArray's replacement.
    Flex,
    /// burn's wgpu backend (CubeCL kernels through wgpu) on the default adapter; with the `wgpu`
    /// feature.
    #[cfg(feature = "wgpu")]
    Wgpu,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::NdArray, Backend::Flex];

    /// `ndarray` or `flex`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "ndarray" => Some(Self::NdArray),
            "flex" => Some(Self::Flex),
            #[cfg(feature = "wgpu")]
            "wgpu" => Some(Self::Wgpu),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::NdArray => "ndarray",
            Self::Flex => "flex",
            #[cfg(feature = "wgpu")]
            Self::Wgpu => "wgpu",
        }
    }

    /// What runs it: the backend's name, and for wgpu the adapter as it names itself (a GPU, or
    /// `llvmpipe (LLVM ...)` for Mesa's lavapipe).
    pub fn describe(self, device: &Device) -> String {
        #[cfg(feature = "wgpu")]
        if self == Self::Wgpu {
            let adapter = device
                .identity()
                .map_or_else(|| "unnamed".to_owned(), |i| i.name);
            return format!("burn wgpu on {adapter}");
        }
        let _ = device;
        format!("burn {}", self.name())
    }

    pub fn device(self) -> Device {
        match self {
            // The backend this example was asked to run on; its deprecation (in favour of
            // Flex, the other choice here) is burn's plan, not a problem of this model.
            #[allow(deprecated)]
            Self::NdArray => Device::ndarray(),
            Self::Flex => Device::flex(),
            #[cfg(feature = "wgpu")]
            Self::Wgpu => Device::wgpu(burn_tensor::DeviceKind::DefaultDevice),
        }
    }
}
