# frozen_string_literal: true

# stackprof's autorun, profiling with Strobe: profiles the whole program
# and writes stackprof's Marshal dump at exit.
#
#   RUBYOPT="-rstrobe/stackprof/autorun" ruby app.rb
#
#   STACKPROF_MODE       wall (default), cpu, object or custom
#   STACKPROF_INTERVAL   sampling interval (an Integer)
#   STACKPROF_RAW        set: keep raw samples
#   STACKPROF_IGNORE_GC  set: no GC samples
#   STACKPROF_OUT        the dump's path (default: a new temporary file)
#
# The path is printed on stderr at exit, as stackprof does.
require_relative "../stackprof"

options = {}
options[:mode] = ENV["STACKPROF_MODE"].to_sym if ENV.key?("STACKPROF_MODE")
options[:interval] = Integer(ENV["STACKPROF_INTERVAL"]) if ENV.key?("STACKPROF_INTERVAL")
options[:raw] = true if ENV["STACKPROF_RAW"]
options[:ignore_gc] = true if ENV["STACKPROF_IGNORE_GC"]

at_exit do
  StackProf.stop
  output_path = ENV.fetch("STACKPROF_OUT") do
    require "tempfile"
    Tempfile.create(["stackprof", ".dump"]).path
  end
  StackProf.results(output_path)&.close
  $stderr.puts("StackProf results dumped at: #{output_path}")
end

StackProf.start(**options)
