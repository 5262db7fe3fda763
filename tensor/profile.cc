#include "tensor/profile.h"

namespace tg {
namespace {
thread_local GemmProfile* current = nullptr;
}  // namespace

GemmProfileScope::GemmProfileScope(GemmProfile* profile) : previous_(current) {
  current = profile;
}
GemmProfileScope::~GemmProfileScope() { current = previous_; }
GemmProfile* CurrentGemmProfile() { return current; }

}  // namespace tg
