#include "worker/train/device/nvtx_range.h"

#include <nvtx3/nvToolsExt.h>

namespace loom::train {

void NvtxPush(const char* name, uint32_t argb) {
  nvtxEventAttributes_t attributes = {};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.colorType = NVTX_COLOR_ARGB;
  attributes.color = argb;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = name;
  nvtxRangePushEx(&attributes);
}

void NvtxPop() { nvtxRangePop(); }

}  // namespace loom::train
