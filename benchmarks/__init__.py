"""The project's comparisons with other engines (HF transformers, llama.cpp), run from a source
checkout: ``python benchmarks/compare.py generate|engine|gpu [...]``. Not part of the installed
package; our side of every comparison is the package's own bench worker."""
