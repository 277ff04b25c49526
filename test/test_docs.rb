# frozen_string_literal: true

require "test_helper"
require "tmpdir"

# Every Ruby code block of README.md and docs/*.md, as copied: each runs
# alone in a fresh directory, with Strobe on the load path, and exits 0. A
# block that cannot run alone (a config.ru, a Rails initializer, an excerpt
# of a bigger program) says so in the Markdown, on the line before it:
#
#   <!-- fragment: why it cannot run alone -->
#
# and is only compiled, so that it at least parses. (The config.ru and the
# Rails initializer of the README run for real in test_middleware.rb and
# test_rails.rb.)
class TestDocs < Minitest::Test
  include StrobeTestHelpers

  FILES = [File.join(ROOT, "README.md"), *Dir[File.join(ROOT, "docs/*.md")].sort].freeze
  FRAGMENT = /\A<!-- fragment: (.+?) -->\z/

  Block = Struct.new(:file, :line, :code, :fragment, keyword_init: true) do
    def where = "#{File.basename(file)}:#{line}"
  end

  # The ```ruby blocks of a Markdown file, each with the line its code
  # starts on and the fragment mark before it, if any.
  def self.blocks(file)
    lines = File.readlines(file, chomp: true)
    found = []
    index = 0
    while index < lines.size
      if lines[index] == "```ruby"
        mark = index.positive? ? lines[index - 1][FRAGMENT, 1] : nil
        finish = (index + 1...lines.size).find { |i| lines[i] == "```" } or
          raise "#{file}:#{index + 1}: a ```ruby block that never ends"
        found << Block.new(file: file, line: index + 2, code: lines[index + 1...finish].join("\n") << "\n",
                           fragment: mark)
        index = finish
      end
      index += 1
    end
    found
  end

  BLOCKS = FILES.flat_map { |file| blocks(file) }.freeze

  # The parser misses no block, and the README has one to run at least.
  def test_the_docs_have_ruby_blocks_to_run
    opened = FILES.sum { |file| File.readlines(file, chomp: true).count("```ruby") }
    assert_equal opened, BLOCKS.size, "the parser found #{BLOCKS.map(&:where)}"
    assert_operator BLOCKS.reject(&:fragment).size, :>=, 5
    assert(BLOCKS.any? { |block| File.basename(block.file) == "README.md" && !block.fragment })
  end

  BLOCKS.each do |block|
    name = "test_#{File.basename(block.file, '.md').downcase}_line_#{block.line}"
    if block.fragment
      define_method(name) do
        RubyVM::InstructionSequence.compile(block.code, block.where)
      rescue SyntaxError => e
        flunk "#{block.where} (a fragment: #{block.fragment}) does not parse: #{e.message}"
      end
    else
      define_method(name) { run_block(block) }
    end
  end

  private

  def run_block(block)
    Dir.mktmpdir("strobe-doc") do |dir|
      File.write(File.join(dir, "block.rb"), block.code)
      out, err, status = run_command({ "RUBYOPT" => nil }, RbConfig.ruby, "-I#{ENV['STROBE_LIB'] || LIB}", "-I#{LIB}",
                                     "block.rb", chdir: dir, timeout: 120)
      assert status.success?, "#{block.where} failed (#{status.inspect}); mark it <!-- fragment: why --> if it " \
                              "cannot run alone.\n#{block.code}\nstdout: #{out[0, 2000]}\nstderr: #{err[0, 2000]}"
    end
  end
end
