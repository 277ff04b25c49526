# frozen_string_literal: true

# Where a profile's source files are: the relative paths Ruby gives some
# frames resolved to absolute ones, so that a file is one file in the
# reports.

module Strobe
  class Report
    # The source files of a result's frames (Report#source_file).
    class SourceFiles
      # Paths that name a source file relative to a directory: not absolute,
      # and not one of Ruby's names for code without a file ("-e", "(eval)",
      # "<internal:kernel>", "<cfunc>").
      def self.relative_path?(file)
        !file.empty? && !file.start_with?("/", "<", "(", "~") && !%w[- -e].include?(file) && !file.include?("\0")
      end

      def initialize(result)
        @result = result
      end

      # The path of a frame's source file: a relative one (`ruby app.rb`
      # makes Ruby name app.rb's top frame "app.rb", its methods' frames
      # "/dir/app.rb") resolved.
      def path(frame)
        file = frame[:file].to_s
        frame[:native] ? file : resolved.fetch(file, file)
      end

      # result with its frames' files resolved (path), for the C reports
      # that count by file.
      def resolve_frames(result)
        return result if resolved.empty?

        result.merge(frames: result[:frames].transform_values do |f|
          f.is_a?(Hash) && !f[:native] && resolved.key?(f[:file]) ? f.merge(file: resolved[f[:file]]) : f
        end)
      end

      private

      # {relative path => absolute path} for the relative paths of the
      # profile's source files: resolved against the directory the profile
      # was taken in (result[:cwd]) or, for a profile without it, taken for
      # the one absolute path of the profile that ends with "/" and the
      # path, when exactly one does.
      def resolved
        @resolved ||= begin
          files = (@result[:frames] || {}).each_value.filter_map do |f|
            f[:file] if f.is_a?(Hash) && f[:file].is_a?(String) && !f[:native]
          end.uniq
          relative = files.select { |file| SourceFiles.relative_path?(file) }
          relative.empty? ? {} : resolve(relative, files)
        end
      end

      def resolve(relative, files)
        cwd = @result[:cwd]
        if cwd.is_a?(String) && cwd.start_with?("/")
          return relative.to_h { |file| [file, File.expand_path(file, cwd)] }
        end

        absolute = files.select { |file| file.start_with?("/") }.group_by { |file| File.basename(file) }
        relative.each_with_object({}) do |file, map|
          suffix = "/#{file.sub(%r{\A(\./)+}, '')}"
          candidates = (absolute[File.basename(file)] || []).select { |path| path.end_with?(suffix) }
          map[file] = candidates.first if candidates.size == 1
        end
      rescue ArgumentError, EncodingError
        {} # a path File will not take (a byte that is not in its encoding)
      end
    end
  end
end
