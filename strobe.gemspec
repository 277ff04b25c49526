# frozen_string_literal: true

require_relative "lib/strobe/version"

Gem::Specification.new do |spec|
  spec.name = "strobe"
  spec.version = Strobe::VERSION
  spec.summary = "Sampling call-stack profiler for Ruby, with a C core and a stackprof-compatible result"
  spec.description = "Strobe samples Ruby call stacks in wall, cpu, object and custom modes, " \
                     "stores them compactly, and reports them as text or stackprof-shaped data."
  spec.authors = ["Strobe developers"]
  spec.license = "MIT"
  spec.required_ruby_version = ">= 3.1"
  spec.files = Dir["lib/**/*.rb", "lib/**/*.html", "ext/**/*.{c,h,rb}", "exe/*", "README.md", "docs/*.md"]
  spec.bindir = "exe"
  spec.executables = ["strobe"]
  spec.extensions = ["ext/strobe/extconf.rb"]
  spec.require_paths = ["lib"]
  spec.add_development_dependency "minitest", ">= 5.15"
  spec.add_development_dependency "rake", ">= 13"
  spec.add_development_dependency "stackprof", "0.2.27"
  spec.add_development_dependency "ruby-prof", "1.4.5" # bench/trace.rb
end
