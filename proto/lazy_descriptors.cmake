# Run by proto/CMakeLists.txt on each generated .pb.cc (cmake -DPB_CC=FILE -P this): removes the
# static object that adds the file's descriptor to protobuf's generated pool at program start.
#
# Why: protobuf 3.21 parses every linked file's whole FileDescriptorProto at start-up to index
# it, whether the program ever uses reflection or not: 1.4 M of the 3.2 M instructions of a
# `loomctl get`, and of every rank's start. Without the static object the descriptor is added
# the first time a message of the file asks for its descriptor (generated code calls
# AssignDescriptors, which adds the file and its imports first), so reflection, JSON and debug
# strings work as before. What no longer works without a use first is a lookup by name in the
# generated pool: programs that serve gRPC reflection call loom::RegisterProtoDescriptors()
# (proto/register_descriptors.h) before they serve.
file(READ "${PB_CC}" text)
# Without the statement's ';' (a ';' would split CMake's list of matches); it is kept after the
# static_assert that replaces the object.
set(pattern "\nPROTOBUF_ATTRIBUTE_INIT_PRIORITY2 static ::_pbi::AddDescriptorsRunner [a-z0-9_]+\\(&[a-z0-9_]+\\)")
string(REGEX MATCHALL "${pattern}" found "${text}")
list(LENGTH found count)
if(NOT count EQUAL 1)
  message(FATAL_ERROR "${PB_CC}: expected one static AddDescriptorsRunner (protobuf 3.21's "
                      "generated code), found ${count}; update proto/lazy_descriptors.cmake")
endif()
string(REGEX REPLACE "${pattern}"
       "\nstatic_assert(true, \"loom: descriptor added on first use (proto/lazy_descriptors.cmake)\")"
       text "${text}")
file(WRITE "${PB_CC}" "${text}")
