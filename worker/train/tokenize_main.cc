// loom-tokenize: turns a text file into a byte-level token file (llm.c layout, vocab 256), or
// writes the built-in tiny-corpus as one.
//   loom-tokenize INPUT.txt OUTPUT.bin
//   loom-tokenize --builtin tiny-corpus OUTPUT.bin
#include <cstdio>
#include <string>
#include <vector>

#include "worker/train/config/json.h"
#include "worker/train/data/tiny_corpus.h"
#include "worker/train/data/token_file.h"
#include "worker/train/error.h"

int main(int argc, char** argv) {
  using namespace loom::train;
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool builtin = args.size() == 3 && args[0] == "--builtin";
  if (!(args.size() == 2 || builtin) || (args.size() == 2 && args[0].rfind("--", 0) == 0)) {
    std::fprintf(stderr,
                 "usage: loom-tokenize INPUT.txt OUTPUT.bin\n"
                 "       loom-tokenize --builtin tiny-corpus OUTPUT.bin\n");
    return kExitBadInput;
  }
  try {
    std::vector<uint16_t> tokens;
    if (builtin) {
      if (args[1] != "tiny-corpus")
        throw BadInput(args[1], "unknown corpus (expected tiny-corpus)");
      tokens = TinyCorpusTokens();
    } else {
      std::string text = ReadFileOrThrow(args[0]);
      tokens.reserve(text.size());
      for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
    }
    if (tokens.empty()) throw BadInput(args[0], "empty input: nothing to tokenize");
    WriteTokenFile(args.back(), tokens);
    std::fprintf(stderr, "loom-tokenize: wrote %zu tokens to %s\n", tokens.size(),
                 args.back().c_str());
    return kExitOk;
  } catch (const InputError& e) {
    std::fprintf(stderr, "loom-tokenize: %s\n", e.what());
    return kExitBadInput;
  } catch (const IoError& e) {
    std::fprintf(stderr, "loom-tokenize: %s\n", e.what());
    return kExitCrash;
  }
}
