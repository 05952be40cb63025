// The unwinder's frame registry, bypassed in the fully static loomctl (client/static_link.sh).
//
// In a program linked with -static, gcc's start file (crtbeginT.o) registers the whole .eh_frame
// section with libgcc's unwinder at start. The first exception thrown then sorts every FDE of
// the program before it can unwind: about 12 ms for loomctl's 15 MB of code, and CLI11 throws
// for every --help and every bad flag (`loomctl --help` took 14 ms of CPU instead of 1.4).
// Dynamically linked programs are not registered: the unwinder asks dl_iterate_phdr for each
// object's PT_GNU_EH_FRAME header, a table sorted by the linker, and searches it in place.
// static_link.sh links loomctl with --eh-frame-hdr, which gives the static program that header
// too (glibc's static dl_iterate_phdr reports the program's own headers), and with
// --wrap=__register_frame_info / --wrap=__deregister_frame_info, which send crtbeginT.o's two
// calls here, where they do nothing. The unwinder then finds loomctl's frames through the header
// alone. tests/client/loomctl_initializers_test.py throws exceptions in the linked loomctl
// (--help, a bad flag, a YAML syntax error) to check that unwinding still works.
//
// In a dynamically linked loomctl these functions are never called (nothing is wrapped).
extern "C" {

void __wrap___register_frame_info(const void* /*begin*/, void* /*object*/) {}

void* __wrap___deregister_frame_info(const void* /*begin*/) { return nullptr; }

}  // extern "C"
