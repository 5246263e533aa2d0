# Front end for the CMake build. `make` builds the library and build/attn, `make demo` runs the
# walkthrough, `make test` builds and runs every test. BUILD, CMAKE_FLAGS and JOBS can be overridden.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all configure demo test clean install

all: configure
	cmake --build $(BUILD) -j $(JOBS)

configure:
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) > /dev/null

demo: all
	./$(BUILD)/attn demo

test: all
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

install: all
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

clean:
	rm -rf $(BUILD)
