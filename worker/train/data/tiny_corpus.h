// "tiny-corpus": a built-in byte-level training corpus, generated in code so that the demo and
// the tests need no download. The text comes from a small probabilistic grammar of English-like
// sentences (subject-verb agreement, adjectives, prepositional phrases, paragraphs), so it has
// structure a small model can learn: the byte unigram entropy is about 2.9 nats, while a model
// that knows the grammar needs far less.
#ifndef LOOM_WORKER_TRAIN_DATA_TINY_CORPUS_H_
#define LOOM_WORKER_TRAIN_DATA_TINY_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace loom::train {

// The corpus text, identical on every call and machine (about 64 KiB of ASCII).
std::string TinyCorpusText();

// The corpus as byte-level tokens (vocab 256).
std::vector<uint16_t> TinyCorpusTokens();

// Entropy in nats of the empirical unigram distribution of `tokens`: the loss of the best model
// that ignores context. Training must get well below it.
double UnigramEntropy(const std::vector<uint16_t>& tokens);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DATA_TINY_CORPUS_H_
