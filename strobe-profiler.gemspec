# frozen_string_literal: true

require_relative "lib/strobe/version"

# Published as strobe-profiler: the name "strobe" on RubyGems belongs to an
# unrelated gem. The library is still `require "strobe"` and the command
# `strobe`; lib/strobe-profiler.rb lets Bundler's auto-require of the gem's
# name load it.
Gem::Specification.new do |spec|
  spec.name = "strobe-profiler"
  spec.version = Strobe::VERSION
  spec.summary = "Sampling call-stack profiler for Ruby with a C core (Linux): every thread, " \
                 "wall/cpu/object modes, flamegraphs, pprof, and a stackprof drop-in"
  spec.description = <<~TEXT.tr("\n", " ").strip
    Strobe samples the call stacks of every Ruby thread, each by its own clock: :wall
    (elapsed time, including sleep and IO), :cpu (each thread's own CPU time), :object
    (allocations) and :custom (samples you take), plus an exact tracing mode that counts and
    times every call. It can record native (C) frames under the Ruby frames that called them.
    Profiles are stored compactly and reported as text, per method, per file, Graphviz,
    callgrind, folded stacks and a self-contained HTML flamegraph, and exported to pprof,
    the Firefox Profiler and speedscope. It comes with the `strobe` command (run, report,
    serve), Rack/Rails middleware with GC, GVL and notification markers, and a drop-in
    replacement for stackprof (require "strobe/stackprof"). Linux only; native frames need
    x86_64 and libunwind. Ruby 3.1 and newer.
  TEXT
  spec.authors = ["Strobe developers"]
  spec.license = "MIT"
  spec.required_ruby_version = ">= 3.1"
  spec.metadata = { "rubygems_mfa_required" => "true" }
  spec.files = Dir["lib/**/*.rb", "lib/**/*.html", "ext/**/*.{c,h,rb}", "exe/*", "README.md", "LICENSE",
                   "docs/*.md"]
  spec.bindir = "exe"
  spec.executables = ["strobe"]
  spec.extensions = ["ext/strobe/extconf.rb"]
  spec.require_paths = ["lib"]
  # What `bundle install && bundle exec rake test` needs in the test process
  # itself (the web-application gems, Puma and Rails, run in child processes
  # from their own gem home: `rake deps`).
  spec.add_development_dependency "minitest", "~> 5.15"
  spec.add_development_dependency "rack", "~> 2.2"
  spec.add_development_dependency "rake", "~> 13.0"
  spec.add_development_dependency "stackprof", "= 0.2.27"
end
